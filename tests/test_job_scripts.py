"""The job scripts as a user runs them: Slurm batch files and mpirun scripts, with a stand-in launcher."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from psgd import protocols as registry
from psgd.mpi.roles import check_servers

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = tuple(registry.PROTOCOLS)


def check_example_config(entry, root=ROOT, data=None):
    """The entry's example config (:meth:`psgd.protocols.Protocol.example_run`) names the
    protocol and passes psgd train's validation (with ``data`` for its dataset)."""
    import argparse

    from psgd.run.settings import add_arguments, resolve
    run = entry.example_run()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = ["--config", str(root / run["config"])] + (["--data", str(data)] if data else [])
    s = resolve(parser.parse_args(args), environ={})
    assert s.protocol == entry.name
    assert s.servers == run["servers"]


def test_every_protocol_has_its_job_scripts_and_no_script_outlives_its_protocol():
    for folder, suffix in (("configs", ".toml"), ("slurm", ".sbatch"), ("mpirun", ".sh")):
        found = {p.stem for p in (ROOT / "jobs" / folder).glob(f"*{suffix}")} - {
            "run", "elastic", "elastic-join"}
        assert found == set(PROTOCOLS), folder


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_example_config_passes_validation(tmp_path, protocol):
    data = tmp_path / "d.h5"
    data.touch()
    check_example_config(registry.PROTOCOLS[protocol], data=data)


def _fake(bin_dir: Path, name: str) -> None:
    """A stand-in ``name`` that prints its arguments (and exits 0)."""
    path = bin_dir / name
    path.write_text('#!/bin/sh\necho "$(basename "$0") $*"\n')
    path.chmod(0o755)


def test_singleton_under_slurm_names_the_pmi_fix(monkeypatch):
    monkeypatch.setenv("SLURM_NTASKS", "3")
    with pytest.raises(ValueError, match=r"Slurm started 3 tasks.*srun --mpi=pmi2"):
        check_servers(1, 1)
    monkeypatch.delenv("SLURM_NTASKS")
    with pytest.raises(ValueError, match="leaves no worker") as info:
        check_servers(1, 1)
    assert "Slurm" not in str(info.value)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batch_file_sets_no_size_passes_flags_and_picks_the_pmi(tmp_path, protocol):
    text = (ROOT / "jobs" / "slurm" / f"{protocol}.sbatch").read_text()
    assert "--nodes" not in text.split("# ")[0] and "--servers" not in text.split("# ")[0]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "srun")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(ROOT),
               PY=sys.executable, SLURM_NTASKS="3", SLURM_JOB_NUM_NODES="2")
    env.pop("SRUN_MPI", None)
    out = subprocess.run(["bash", str(ROOT / "jobs" / "slurm" / f"{protocol}.sbatch"),
                          "--epochs", "1"], env=env, capture_output=True, text=True, check=True,
                         cwd=tmp_path).stdout
    srun = [line for line in out.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1, out
    # this venv's MPI is the PyPI MPICH: pmi2 (Open MPI would get pmix)
    assert srun[0].startswith("srun --mpi=pmi2 --distribution=cyclic ")
    assert srun[0].endswith(f"--config jobs/configs/{protocol}.toml --resume auto --quiet --epochs 1")


def test_batch_file_srun_mpi_can_be_chosen(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "srun")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_SUBMIT_DIR=str(ROOT),
               PY=sys.executable, SRUN_MPI="pmix", SLURM_JOB_NUM_NODES="1")
    out = subprocess.run(["bash", str(ROOT / "jobs" / "slurm" / "bsp.sbatch")], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert f"srun --mpi=pmix {sys.executable} -m psgd train" in out


def _elastic_srun(bin_dir: Path) -> None:
    """A stand-in srun that prints its arguments, writes the port file of a server step (as
    the servers do once ready), and exits 3 (dropped) on a join's first try."""
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        '#!/bin/sh\necho "srun $*"\n'
        'case "$*" in *" train --elastic "*) touch "$PORT" ;; esac\n'
        'case "$*" in *" join "*) [ -f "$PORT.tried" ] || { touch "$PORT.tried"; exit 3; } ;;'
        ' esac\n')
    (bin_dir / "srun").chmod(0o755)


def test_elastic_batch_files_start_the_servers_then_the_workers(tmp_path, monkeypatch):
    import argparse

    from psgd.run.settings import add_arguments, resolve
    _elastic_srun(tmp_path / "bin")
    port = tmp_path / "run.port"
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", PORT=str(port),
               SLURM_SUBMIT_DIR=str(ROOT), PY=sys.executable, SLURM_NTASKS="4")
    out = subprocess.run(["bash", str(ROOT / "jobs" / "slurm" / "elastic.sbatch"), "--steps",
                          "50"], env=env, capture_output=True, text=True, check=True).stdout
    srun = [line for line in out.splitlines() if line.startswith("srun ")]
    step = f"srun --mpi=pmi2 -N1 -n1 {sys.executable} -m psgd"
    assert srun[0] == (f"{step} train --elastic --config jobs/configs/asp.toml --port-file "
                       f"{port} --resume auto --quiet --steps 50"), out
    assert srun[1:] == [f"{step} join --port-file {port}"] * 3, out
    # the server step's flags are a valid elastic run (its checkpoints under tmp_path)
    monkeypatch.chdir(tmp_path)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = srun[0].split(" train ")[1].split()
    flags[flags.index("--config") + 1] = str(ROOT / "jobs" / "configs" / "asp.toml")
    (tmp_path / "d.h5").touch()
    args = parser.parse_args([*flags, "--data", str(tmp_path / "d.h5")])
    assert resolve(args, environ={}).steps == 50 and args.elastic
    # a worker job: a join the servers dropped (exit 3) joins again
    (tmp_path / "run.port.tried").unlink(missing_ok=True)
    join = subprocess.run(["bash", str(ROOT / "jobs" / "slurm" / "elastic-join.sbatch")],
                          env=env, capture_output=True, text=True)
    assert join.returncode == 0, join.stderr
    assert join.stdout.splitlines() == [f"srun --mpi=pmi2 -n1 {sys.executable} -m psgd join "
                                        f"--port-file {port}"] * 2


def test_mpirun_script_takes_a_launcher_with_options_and_falls_back_to_path(tmp_path):
    """In a tree without .venv (as after make install MPI=system elsewhere): mpiexec on PATH."""
    bin_dir, tree = tmp_path / "bin", tmp_path / "tree"
    bin_dir.mkdir()
    _fake(bin_dir, "mpirun")
    _fake(bin_dir, "mpiexec")
    shutil.copytree(ROOT / "jobs" / "mpirun", tree / "jobs" / "mpirun")
    (tree / "data").mkdir()
    (tree / "data" / "synth.h5").touch()   # the script makes it when missing
    script = str(tree / "jobs" / "mpirun" / "ssp.sh")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PY=sys.executable,
               MPIEXEC="mpirun --oversubscribe")
    out = subprocess.run([script, "--steps", "2"], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith("mpirun --oversubscribe -n 3 ")
    assert out.strip().endswith("--config jobs/configs/ssp.toml --steps 2")
    env.pop("MPIEXEC")
    out = subprocess.run([script], env=env, capture_output=True, text=True, check=True).stdout
    assert out.startswith("mpiexec -n 3 ")
    env["MPIEXEC"] = "no-such-launcher -x"
    proc = subprocess.run([script], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "no launcher no-such-launcher" in proc.stderr


def test_run_length_flag_after_a_config_replaces_its_epochs(tmp_path):
    """`sbatch jobs/slurm/ssp.sbatch --steps 20`: the config says epochs, the flag wins."""
    import argparse

    from psgd.run.settings import add_arguments, resolve
    data = tmp_path / "d.h5"
    data.touch()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = str(ROOT / "jobs" / "configs" / "ssp.toml")
    s = resolve(parser.parse_args(["--config", config, "--data", str(data), "--steps", "20"]))
    assert (s.steps, s.epochs) == (20, None)
    s = resolve(parser.parse_args(["--config", config, "--data", str(data)]))
    assert (s.steps, s.epochs) == (None, 3.0)
    with pytest.raises(ValueError, match="not both"):
        resolve(parser.parse_args(["--data", str(data), "--steps", "2", "--epochs", "1"]))


def test_resume_auto_needs_a_checkpoint_dir(tmp_path):
    import argparse

    from psgd.run.settings import add_arguments, resolve
    data = tmp_path / "d.h5"
    data.touch()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(ValueError, match="--resume auto needs --checkpoint-dir"):
        resolve(parser.parse_args(["--data", str(data), "--resume", "auto"]))


def test_mpirun_script_trains_on_a_fresh_clone_and_a_rerun_keeps_the_first_runs_files(tmp_path):
    """A fresh clone has jobs/ and no data/ or runs/; the second run must not clobber the first."""
    from conftest import mpiexec_path
    tree = tmp_path / "clone"
    shutil.copytree(ROOT / "jobs", tree / "jobs")
    script = [str(tree / "jobs" / "mpirun" / "ssp.sh"), "--steps", "4", "--eval-every", "0",
              "--checkpoint-every", "2", "--quiet"]
    env = dict(os.environ, PY=sys.executable, MPIEXEC=mpiexec_path(), PSGD_STALL_ABORT="60")
    out = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "final test accuracy" in out.stdout
    log = tree / "runs" / "ssp.jsonl"
    first = log.read_bytes()
    assert (tree / "runs" / "ssp-ckpt" / "ckpt-00000004.h5").is_file()
    again = subprocess.run(script, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        "psgd: error: --log runs/ssp.jsonl exists (another run's log): continue that run with "
        "--resume, replace the log with --overwrite, or give another --log"]
    assert log.read_bytes() == first
