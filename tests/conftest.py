"""Shared fixtures: a runner for scripts under mpiexec, with a hard timeout and no leftovers."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPI_DIR = ROOT / "tests" / "mpi"


def mpiexec_path() -> str:
    env = os.environ.get("PSGD_MPIEXEC")
    if env:
        return env
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def run_mpi(n: int, args, *, timeout: float = 120, env: dict | None = None,
            check: bool = True, cwd=None) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` on ``n`` ranks; kill the whole process group on timeout.

    ``args`` is a list: a script path (relative to tests/mpi or absolute) or
    ``["-m", "psgd", ...]``.  With ``check`` a non-zero exit fails the test and
    shows both output streams.
    """
    args = [str(a) for a in args]
    if args and args[0] != "-m" and not os.path.isabs(args[0]):
        args[0] = str(MPI_DIR / args[0])
    cmd = [mpiexec_path(), "-n", str(n), sys.executable, *args]
    full_env = dict(os.environ)
    full_env.setdefault("PSGD_STALL_ABORT", str(max(30, int(timeout) - 10)))
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, cwd=cwd or ROOT, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timeout after {timeout}s: {' '.join(cmd)}\n--- stdout\n{out}\n--- stderr\n{err}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check and proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}: {' '.join(cmd)}\n--- stdout\n{out}\n--- stderr\n{err}")
    return result


@pytest.fixture
def mpirun():
    """The :func:`run_mpi` runner."""
    return run_mpi
