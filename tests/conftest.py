"""Shared fixtures: a runner for scripts under mpiexec, with a hard timeout and no leftovers;
the test tiers' markers (see docs/guide/testing.md)."""
import os
import select
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
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


@pytest.fixture
def data(tmp_path):
    """An empty file where a dataset is expected: `psgd train`'s settings check only that it exists."""
    path = tmp_path / "d.h5"
    path.write_bytes(b"")
    return str(path)


def parse_train(*argv):
    """`psgd train ARGV` as the command line parses it."""
    from psgd.cli import build_parser
    return build_parser().parse_args(["train", *argv])


def write_synth(path, n_train: int = 1200, n_test: int = 200) -> str:
    """Write a small synthetic psgd dataset (seed 0) at ``path``; returns the path as str."""
    x, y, xt, yt = make_synthetic(n_train, n_test, seed=0)
    write_dataset(path, x, y, xt, yt, n_classes=10, scale=1 / 255, offset=0.0, source="test")
    return str(path)


def serial_float64(data, spec, replicas, steps, batch, lr, momentum):
    """Serial float64 momentum SGD on the union of the replicas' batches (replica r's slice at
    every step, the gradients averaged): every step's losses, one column per replica, and the
    final test loss (batch-norm statistics from replica 0's calibration rows)."""
    from psgd.data.reader import ShardReader, dataset_info
    from psgd.nn.model import build_model
    from psgd.nn.optim import make_optimizer
    info = dataset_info(data)
    model = build_model(spec, seed=0, dtype=np.float64, input_shape=info["input_shape"],
                        n_classes=info["n_classes"])
    readers = [ShardReader(data, r, replicas, batch, seed=0) for r in range(replicas)]
    opt = make_optimizer("momentum", model.n_params, momentum=momentum, dtype=np.float64)
    losses = np.zeros((steps, replicas))
    for step in range(steps):
        grad = np.zeros(model.n_params)
        for r, reader in enumerate(readers):
            model.reseed(r, step)
            losses[step, r] = model.loss_and_grad(*reader.batch(step))[0]
            grad += model.grad
        opt.step(model.params, grad / replicas, lr)
    model.set_calibration(readers[0].calibration_rows(512)[0])
    return losses, model.evaluate(*readers[0].test_set())[0]


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
    """Processes whose environment holds ``PSGD_X_TEST_MARK=marker`` (the jobs a test started).

    With ``ranks_only``, only the python ranks (not mpiexec or hydra's proxies).
    """
    needle = f"PSGD_X_TEST_MARK={marker}".encode()
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


def wait_gone(pids, timeout: float) -> list[int]:
    """Wait until the processes ``pids`` have ended, at most ``timeout`` s; the ones still alive.

    Waits on each process's pidfd (readable when it ends), so it returns as soon as the
    last one is gone, without a sleep loop.
    """
    deadline = time.monotonic() + timeout
    left = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                left.append(pid)
        finally:
            os.close(fd)
    return left


def wait_marked_gone(marker: str, timeout: float, ranks_only: bool = False) -> list[int]:
    """:func:`wait_gone` for the processes of :func:`marked_pids`; the ones still alive."""
    deadline = time.monotonic() + timeout
    while (left := marked_pids(marker, ranks_only)):
        # a process may start a child just before it ends: look again until none is left
        if wait_gone(left, max(0.0, deadline - time.monotonic())):
            return marked_pids(marker, ranks_only)
    return []


# ---- the tiers: markers set here, selected by the Makefile (test, test-all, soak)

# what a test (or a helper it calls) names when it starts ranks
_LAUNCHERS = {"run_mpi", "mpiexec_path", "mpirun"}


def _names(code: types.CodeType) -> set[str]:
    names = set(code.co_names) | set(code.co_varnames)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _launches(func, seen: set) -> bool:
    """Whether ``func`` or a function of its module that it calls (transitively) starts ranks."""
    code = getattr(func, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    names = _names(code)
    if names & _LAUNCHERS:
        return True
    glob = getattr(func, "__globals__", {})
    return any(_launches(glob[n], seen) for n in names
               if isinstance(glob.get(n), types.FunctionType)
               and glob[n].__module__ == func.__module__)


def pytest_collection_modifyitems(config, items):
    """Mark ``mpi`` every test that starts ranks: through the ``mpirun`` fixture, or by
    calling run_mpi / mpiexec_path itself, in a helper of its module or in a fixture."""
    for item in items:
        if item.get_closest_marker("mpi"):
            continue
        info = getattr(item, "_fixtureinfo", None)
        funcs = [getattr(item, "function", None)] + [
            d.func for defs in (info.name2fixturedefs.values() if info else ()) for d in defs
            if d.func.__module__ != __name__]
        if "mpirun" in item.fixturenames or any(_launches(f, set()) for f in funcs if f):
            item.add_marker("mpi")


@pytest.fixture(scope="session")
def _numba_warm():
    """Before the session's first launch: compile the kernels most ranks call, once, into numba's
    on-disk cache (NUMBA_CACHE_DIR, else __pycache__ beside each module), which the ranks then
    load instead of each compiling them side by side. Seconds when the cache is warm."""
    subprocess.run([sys.executable, str(MPI_DIR / "warm_numba.py"), "mlp:784-32-10", "lenet"],
                   check=True, timeout=600, cwd=ROOT)


@pytest.fixture(autouse=True)
def _mpi_marked(request, monkeypatch):
    """A test not marked ``mpi`` that starts mpiexec fails, naming the mark it lacks, so the
    fast tier (``-m "not mpi"``) cannot take in a launch unseen."""
    if request.node.get_closest_marker("mpi"):
        request.getfixturevalue("_numba_warm")
        yield
        return
    original = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        first = args if isinstance(args, (str, bytes, os.PathLike)) else (args[0] if args else "")
        name = os.path.basename(os.fsdecode(first).split()[0]) if first else ""
        if name.startswith(("mpiexec", "mpirun")):
            pytest.fail(f"{request.node.nodeid} starts {name}: mark it pytest.mark.mpi",
                        pytrace=False)
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)
    yield


def assert_resumed_alike(tmp_path, full, part) -> None:
    """A run resumed at step 10 into ``part`` ends (step 20) bit-equal to the unbroken one in
    ``full``: parameters, momentum, and the final evaluation of logs full.jsonl / part.jsonl."""
    import numpy as np

    from psgd.run.checkpoint import load_checkpoint
    from psgd.run.metrics import read_log
    a, b = load_checkpoint(full / "ckpt-00000020.h5"), load_checkpoint(part / "ckpt-00000020.h5")
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.opt_state["velocity"], b.opt_state["velocity"])
    assert not np.array_equal(a.params, load_checkpoint(full / "ckpt-00000010.h5").params)
    # the evaluation's batch-norm statistics are recomputed, so the resumed run evaluates alike
    ends = [read_log(tmp_path / f"{name}.jsonl")[-1] for name in ("full", "part")]
    assert ends[0]["test_loss"] == ends[1]["test_loss"]
