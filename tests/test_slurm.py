"""The Slurm batch files on a real one-node Slurm (tests/slurm/cluster.sh): run, scancel, USR1 and requeue."""
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, marked_pids, run_mpi, shm_left, wait_marked_gone

from psgd.run.checkpoint import load_checkpoint

pytestmark = [pytest.mark.slurm, pytest.mark.root]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
PROTOCOLS = ("bsp", "ssp", "asp", "hogwild", "allreduce")
SMALL = ["--model", "mlp:784-32-10", "--eval-every", "0"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running one-node cluster: the environment for its clients (SLURM_CONF)."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm test starts slurmctld/slurmd and may apt-get install: needs root")
    installed = subprocess.run([str(CLUSTER), "install"], capture_output=True, text=True)
    if installed.returncode != 0 or not shutil.which("sbatch"):
        pytest.skip(f"slurm-wlm/munge missing and not installable here: {installed.stderr[-300:]}")
    state = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ, SLURMCTLD_PORT=str(_free_port()), SLURMD_PORT=str(_free_port()))
    started = subprocess.run([str(CLUSTER), "start", str(state)], capture_output=True, text=True,
                             env=env, timeout=60)
    try:
        assert started.returncode == 0, started.stderr
        yield dict(os.environ, SLURM_CONF=str(state / "slurm.conf"))
    finally:
        subprocess.run([str(CLUSTER), "stop", str(state)], timeout=30)
    pids = [state / f for f in ("slurmctld.pid", "slurmd.pid", "munge/munged.pid")]
    alive = [p.name for p in pids if p.exists() and Path(f"/proc/{p.read_text().strip()}").exists()]
    assert not alive, f"daemons left running: {alive}"


def _submit(slurm, out_dir, name, *flags, env=None, options=()) -> str:
    cmd = ["sbatch", "--parsable", f"--output={out_dir}/%x-%j.out", *options,
           f"jobs/slurm/{name}.sbatch", *map(str, flags)]
    done = subprocess.run(cmd, cwd=ROOT, env={**slurm, **(env or {})}, capture_output=True,
                          text=True, check=True)
    return done.stdout.strip().split(";")[0]


def _job(slurm, jid: str) -> dict:
    """scontrol's record of a job (kept for MinJobAge after it ends), as key=value pairs."""
    text = subprocess.run(["scontrol", "-o", "show", "job", jid], env=slurm, capture_output=True,
                          text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))


def _wait(slurm, jid: str, until, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = _job(slurm, jid)
        if until(job):
            return job
        time.sleep(0.2)
    pytest.fail(f"job {jid}: not {what} after {timeout} s: {_job(slurm, jid)}")


def _ended(job: dict) -> bool:
    return job.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


def _logged_a_step(log: Path) -> bool:
    return log.exists() and '"kind": "step"' in log.read_text()


def _output(out_dir: Path, jid: str) -> str:
    return "".join(p.read_text() for p in out_dir.glob(f"*-{jid}.out"))


def test_every_batch_file_runs_as_submitted_to_a_final_accuracy(slurm, dataset, tmp_path):
    jobs = {p: _submit(slurm, tmp_path, p, "--data", dataset, *SMALL, "--steps", 20,
                       "--checkpoint-dir", tmp_path / p, "--log", tmp_path / f"{p}.jsonl")
            for p in PROTOCOLS}
    for protocol, jid in jobs.items():
        job = _wait(slurm, jid, _ended, 180, "finished")
        out = _output(tmp_path, jid)
        assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), out
        assert "srun --mpi=pmi2" in out and re.search(r"final test accuracy 0\.\d{4}", out), out
        assert (tmp_path / protocol / "ckpt-00000020.h5").exists()


def test_srun_without_a_pmi_the_mpi_speaks_is_named_in_the_error(slurm, dataset, tmp_path):
    jid = _submit(slurm, tmp_path, "ssp", "--data", dataset, *SMALL, "--steps", 5,
                  env={"SRUN_MPI": "none"})
    job = _wait(slurm, jid, _ended, 120, "finished")
    out = _output(tmp_path, jid)
    assert job["JobState"] == "FAILED", out
    assert "Slurm started 3 tasks but MPI sees each alone" in out and "srun --mpi=pmi2" in out, out


def test_scancel_stops_the_job_with_a_checkpoint_leaving_nothing_behind(slurm, dataset, tmp_path):
    marker, log = f"scancel-{os.getpid()}", tmp_path / "log.jsonl"
    shm_before = set(os.listdir("/dev/shm"))
    jid = _submit(slurm, tmp_path, "ssp", "--data", dataset, *SMALL, "--steps", 100000,
                  "--checkpoint-dir", tmp_path / "ck", "--log", log, env={"PSGD_X_TEST_MARK": marker})
    _wait(slurm, jid, lambda job: _logged_a_step(log) or _ended(job), 120, "training")
    subprocess.run(["scancel", jid], env=slurm, check=True)
    job = _wait(slurm, jid, _ended, 30, "cancelled")
    out = _output(tmp_path, jid)
    assert job["JobState"] == "CANCELLED", out
    assert re.search(r"psgd: stopped by SIGTERM at step \d+ of 100000", out), out
    assert list((tmp_path / "ck").glob("ckpt-*.h5")), out
    assert not wait_marked_gone(marker, 10)
    assert not shm_left(shm_before)


def test_a_segment_a_killed_step_left_is_named_when_its_requeued_job_stalls_in_mpi_init(
        slurm, dataset, tmp_path):
    marker, log = f"segment-{os.getpid()}", tmp_path / "log.jsonl"
    jid = _submit(slurm, tmp_path, "asp", "--data", dataset, *SMALL, "--steps", 100000,
                  "--log", log, "--checkpoint-dir", tmp_path / "ck",
                  env={"PSGD_X_TEST_MARK": marker, "PSGD_STALL_TIMEOUT": "3",
                       "PSGD_STALL_ABORT": "20", "PSGD_REQUEUE": "0"})
    _wait(slurm, jid, lambda job: _logged_a_step(log) or _ended(job), 120, "training")
    for pid in marked_pids(marker, ranks_only=True):   # a node's OOM killer, say
        os.kill(pid, signal.SIGKILL)
    _wait(slurm, jid, _ended, 60, "failed")
    h = 2166136261    # MPICH's name for the step's segment: FNV-1a of its PMI name, JOBID.0
    for byte in f"{jid}.0".encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    stale = Path(f"/dev/shm/mpich_shm_{h:x}_0")
    try:
        assert stale.exists(), sorted(os.listdir("/dev/shm"))
        subprocess.run(["scontrol", "requeue", jid], env=slurm, check=True)
        job = _wait(slurm, jid, lambda job: _ended(job) and int(job["Restarts"]) == 1, 180,
                    "stopped by its MPI_Init watchdog")
    finally:
        stale.unlink(missing_ok=True)
    out = _output(tmp_path, jid)
    assert job["JobState"] == "FAILED", out
    said = rf"rank \d stalled: waiting \d+ s for MPI_Init: {stale} existed.*remove it"
    assert re.search(said, out), out


def test_usr1_checkpoints_and_the_requeued_job_ends_where_an_uninterrupted_run_ends(
        slurm, dataset, tmp_path):
    flags = ["--data", dataset, *SMALL, "--optimizer", "momentum", "--lr", "0.05",
             "--batch-size", 16, "--steps", 600, "--seed", 3]
    log, ck = tmp_path / "log.jsonl", tmp_path / "ck"
    jid = _submit(slurm, tmp_path, "bsp", *flags, "--checkpoint-dir", ck, "--log", log,
                  env={"PSGD_X_STOP_EVERY": "8"})
    _wait(slurm, jid, lambda job: _logged_a_step(log) or _ended(job), 120, "training")
    # what Slurm sends 120 s before the time limit (#SBATCH --signal=USR1@120)
    subprocess.run(["scancel", "--signal=USR1", jid], env=slurm, check=True)
    _wait(slurm, jid, lambda job: "requeued" in _output(tmp_path, jid), 60, "requeued")
    # Slurm starts it again once the old credential expires (cred_expire in cluster.sh)
    job = _wait(slurm, jid, lambda job: _ended(job) and "final test accuracy" in
                _output(tmp_path, jid), 240, "finished after its requeue")
    out = _output(tmp_path, jid)
    assert job["JobState"] == "COMPLETED" and int(job["Restarts"]) == 1, out
    stop = re.search(r"psgd: stopped by SIGUSR1 at step (\d+) of 600", out)
    assert stop and 0 < int(stop.group(1)) < 600, out
    full = tmp_path / "full"
    run_mpi(3, ["-m", "psgd", "train", "--config", "jobs/configs/bsp.toml", "--quiet",
                *map(str, flags), "--checkpoint-dir", str(full),
                "--log", str(tmp_path / "full.jsonl")], timeout=180)
    a, b = (load_checkpoint(d / "ckpt-00000600.h5") for d in (full, ck))
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.opt_state["velocity"], b.opt_state["velocity"])
