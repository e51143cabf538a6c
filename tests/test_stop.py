"""Stopping a run by a signal (Slurm's time-limit warning, scancel, preemption, Ctrl-C) and resuming it."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import marked_pids, mpiexec_path, shm_left

from psgd.run.checkpoint import list_checkpoints, load_checkpoint
from psgd.run.metrics import read_log
from psgd.run.signals import EXIT_STOPPED

MLP = "mlp:784-32-10"
STEPS = 600
EVERY = 8   # PSGD_X_STOP_EVERY in these tests


def _common(protocol: str, servers: int) -> list[str]:
    opt = "sgd" if protocol == "hogwild" else "momentum"
    return ["--model", MLP, "--protocol", protocol, "--servers", str(servers), "--optimizer", opt,
            "--lr", "0.05", "--batch-size", "16", "--steps", str(STEPS), "--seed", "3", "--quiet"]


def _start(n: int, flags: list, marker: str, every: int = EVERY) -> subprocess.Popen:
    env = dict(os.environ, PSGD_X_TEST_MARK=marker, PSGD_X_STOP_EVERY=str(every),
               PYTHONUNBUFFERED="1", PSGD_STALL_ABORT="60")
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, "-m", "psgd", "train", *map(str, flags)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 120):
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timeout\n--- stdout\n{out}\n--- stderr\n{err}")


def _rank_pid(marker: str, rank: int) -> int:
    for pid in marked_pids(marker, ranks_only=True):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"PMI_RANK={rank}".encode() in env:
            return pid
    raise AssertionError(f"no rank {rank} of job {marker}")


def _wait_for_training(log: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the lead has logged a step record (the run is past set-up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and any(json.loads(line)["kind"] == "step"
                                for line in log.read_text().splitlines() if line.endswith("}")):
            return
        time.sleep(0.05)
    raise AssertionError(f"no step record in {log}")


def _signal_mid_run(dataset, tmp_path, protocol, n, servers, rank, sig, marker):
    """Run, send ``sig`` to ``rank`` once training runs; returns (out, err, rc, ckdir)."""
    ckdir, log = tmp_path / "part", tmp_path / "part.jsonl"
    before = set(os.listdir("/dev/shm"))
    # 5 ms a step: 600 steps take 3 s or more, so the run cannot end before the signal lands
    # (fused hogwild ran all 600 in 0.3 s); the sleeps do not change the numbers
    proc = _start(n, ["--data", dataset, *_common(protocol, servers), "--straggler", "all:p=1,d=0.005",
                      "--checkpoint-dir", ckdir, "--resume", "auto", "--log", log], marker)
    _wait_for_training(log, proc)
    os.kill(_rank_pid(marker, rank), sig)
    out, err = _finish(proc)
    assert not shm_left(before), shm_left(before)
    return out, err, proc.returncode, ckdir


@pytest.mark.parametrize("protocol, n, servers, rank, sig, exact", [
    ("bsp", 3, 1, 0, signal.SIGUSR1, True),       # a server signalled: it tells the workers
    ("allreduce", 2, 0, 1, signal.SIGTERM, True),  # a worker that is not the lead
    ("asp", 3, 1, 2, signal.SIGTERM, False),       # no bound: each worker stops at once
    ("hogwild", 3, 1, 0, signal.SIGUSR1, False),
])
def test_signal_on_one_rank_stops_all_at_one_step_and_resume_auto_finishes(
        mpirun, dataset, tmp_path, protocol, n, servers, rank, sig, exact):
    out, err, rc, ckdir = _signal_mid_run(dataset, tmp_path, protocol, n, servers, rank, sig,
                                          f"stop-{protocol}-{os.getpid()}")
    assert rc == EXIT_STOPPED, (out, err)
    lines = [line for line in out.splitlines() if line.startswith("psgd:")]
    assert len(lines) == 1 and f"stopped by {signal.Signals(sig).name}" in lines[0], out
    assert "Traceback" not in err and "error" not in err, err
    stopped = load_checkpoint(list_checkpoints(ckdir)[-1])
    # the checkpoint is at the slowest worker's step: without a bound (asp, hogwild) a worker
    # the scheduler has not yet run may be at step 0 when the lead has logged its first steps
    assert (0 < stopped.step if exact else 0 <= stopped.step) and stopped.step < STEPS, stopped.step
    if exact:   # a finite bound: every worker stopped at one stop check
        assert stopped.step % EVERY == 0, stopped.step
    assert f"at step {stopped.step} of {STEPS}" in lines[0]
    summary = read_log(tmp_path / "part.jsonl")[-1]
    assert summary["stopped"] == signal.Signals(sig).name and summary["steps"] == stopped.step

    # the requeued job: same command, --resume auto, here with another number of servers
    more = 1 if servers else 0
    mpirun(n + more, ["-m", "psgd", "train", "--data", dataset, *_common(protocol, servers + more),
                      "--checkpoint-dir", ckdir, "--resume", "auto", "--log", tmp_path / "b.jsonl"])
    resumed = read_log(tmp_path / "b.jsonl")[-1]
    assert (resumed["start_step"], resumed["steps"], resumed["stopped"]) == (stopped.step, STEPS, None)
    if exact:
        full = tmp_path / "full"
        mpirun(n, ["-m", "psgd", "train", "--data", dataset, *_common(protocol, servers),
                   "--checkpoint-dir", full, "--resume", "auto"])
        a, b = (load_checkpoint(d / f"ckpt-{STEPS:08d}.h5") for d in (full, ckdir))
        np.testing.assert_array_equal(a.params, b.params)
        np.testing.assert_array_equal(a.opt_state["velocity"], b.opt_state["velocity"])
        again = mpirun(n, ["-m", "psgd", "train", "--data", dataset, *_common(protocol, servers),
                           "--checkpoint-dir", full, "--resume", "auto"], check=False)
        assert again.returncode == 1 and "nothing left to train" in again.stderr, again.stderr


def test_the_stop_check_follows_the_step_time_so_slow_steps_stop_within_a_few(tmp_path, dataset):
    # 0.2 s a step: checks about every 3 clocks, where a fixed 32 would stop at clock 64
    log, marker = tmp_path / "slow.jsonl", f"slow-{os.getpid()}"
    flags = ["--data", dataset, *_common("bsp", 1), "--straggler", "all:p=1,d=0.2",
             "--checkpoint-dir", tmp_path / "ck", "--log", log]
    proc = _start(3, [f if f != str(STEPS) else "300" for f in map(str, flags)], marker, every=0)
    _wait_for_training(log, proc)
    records = [json.loads(line) for line in log.read_text().splitlines() if line.endswith("}")]
    signalled = max(r["step"] for r in records if r["kind"] == "step")
    os.kill(_rank_pid(marker, 1), signal.SIGTERM)
    out, err = _finish(proc)
    assert proc.returncode == EXIT_STOPPED, (out, err)
    stopped = load_checkpoint(list_checkpoints(tmp_path / "ck")[-1])
    assert signalled <= stopped.step < 32, (signalled, stopped.step)


def test_ctrl_c_under_mpiexec_stops_with_one_line_and_no_traceback(tmp_path, dataset):
    marker = f"ctrlc-{os.getpid()}"
    log = tmp_path / "log.jsonl"
    proc = _start(3, ["--data", dataset, *_common("ssp", 1), "--log", log], marker)
    _wait_for_training(log, proc)
    proc.send_signal(signal.SIGINT)   # mpiexec forwards it to every rank
    out, err = _finish(proc)
    assert proc.returncode == EXIT_STOPPED, (out, err)
    assert "Traceback" not in err and "psgd: error" not in err, err
    psgd_lines = [line for line in (out + err).splitlines() if line.startswith("psgd:")]
    assert len(psgd_lines) == 1 and "stopped by SIGINT" in psgd_lines[0], (out, err)
    assert "no checkpoint (no --checkpoint-dir)" in psgd_lines[0]
    assert not marked_pids(marker)


def test_signals_until_the_job_is_gone_still_end_it_as_stopped(tmp_path, dataset):
    """The first signal stops the run; later ones, down to the ranks' shutdown, change nothing."""
    marker, log = f"storm-{os.getpid()}", tmp_path / "log.jsonl"
    proc = _start(3, ["--data", dataset, *_common("ssp", 1), "--log", log,
                      "--checkpoint-dir", tmp_path / "ck"], marker)
    _wait_for_training(log, proc)
    while proc.poll() is None:
        for pid in marked_pids(marker, ranks_only=True):
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    out, err = _finish(proc)
    assert proc.returncode == EXIT_STOPPED, (out, err)
    assert "stopped by SIGUSR1" in out and "BAD TERMINATION" not in out + err, (out, err)
