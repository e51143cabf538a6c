"""Shared fixtures: a runner for scripts under mpiexec, with a hard timeout and no leftovers."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from psgd.data import make_synthetic, write_dataset

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


def write_synth(path, n_train: int = 1200, n_test: int = 200) -> str:
    """Write a small synthetic psgd dataset (seed 0) at ``path``; returns the path as str."""
    x, y, xt, yt = make_synthetic(n_train, n_test, seed=0)
    write_dataset(path, x, y, xt, yt, n_classes=10, scale=1 / 255, offset=0.0, source="test")
    return str(path)


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """A small synthetic dataset (1200 train, 200 test) shared by the end-to-end tests."""
    return write_synth(tmp_path_factory.mktemp("data") / "synth.h5")


def shm_left(before: set) -> list[str]:
    """New /dev/shm entries that no live process maps (what a dead job left behind)."""
    new = set(os.listdir("/dev/shm")) - before
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            mapped.update(line.rsplit("/dev/shm/", 1)[1].split()[0]
                          for line in maps.read_text().splitlines() if "/dev/shm/" in line)
        except (OSError, IndexError):
            continue
    return sorted(new - mapped)


@pytest.fixture(scope="session", autouse=True)
def _sweep_shm():
    """Remove the MPICH and UCX segments that ranks the tests killed could not free.

    MPICH names a node's segment after the job (a hash of its PMI name), so one
    left behind makes a later job of the same name wait forever in MPI_Init.
    """
    before = set(os.listdir("/dev/shm"))
    yield
    for name in shm_left(before):
        if name.startswith(("mpich_", "ucx_")):
            Path("/dev/shm", name).unlink(missing_ok=True)


def marked_pids(marker: str, ranks_only: bool = False) -> list[int]:
    """Processes whose environment holds ``PSGD_TEST_MARK=marker`` (the jobs a test started).

    With ``ranks_only``, only the python ranks (not mpiexec or hydra's proxies).
    """
    needle = f"PSGD_TEST_MARK={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if ranks_only and (b"psgd" not in cmdline or b"mpiexec" in cmdline or b"hydra" in cmdline):
            continue
        found.append(int(entry.name))
    return sorted(found)
