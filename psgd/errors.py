"""The one error type users see as a plain message, and the rule that a failure ends the whole job."""
from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback

ABORT_GRACE_S = 0.3  # between the message and MPI_Abort


class PsgdError(Exception):
    """A user-facing error: bad input, bad config, a failed run.  Printed as one line."""


class UsageError(PsgdError, ValueError):
    """What the user can fix (a flag, a file, a launch): printed as one line, exit 2 where
    the command line was wrong."""


class NonFinitePush(PsgdError):
    """A push to a parameter server held NaN or Inf: names the worker rank and the clock."""

    def __init__(self, source: int, clock: int) -> None:
        super().__init__(f"push from rank {source} for clock {clock} holds non-finite values "
                         f"(NaN or Inf); lower the learning rate, or pass --skip-nonfinite")
        self.source, self.clock = source, clock


def launcher_rank() -> int:
    """This process's rank as the launcher set it (without initialising MPI); 0 if unknown."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        value = os.environ.get(var)
        if value and value.isdigit():
            return int(value)
    return 0


_traceback_base = {"path": None}   # set_traceback_base(): where a bug's traceback is written


def set_traceback_base(log: str | None) -> None:
    """A bug's traceback goes to ``<log>.rank<R>.traceback`` (None: the temp folder's
    ``psgd-<pid>``)."""
    _traceback_base["path"] = log


def _bug(exc: BaseException, rank: int, debug: bool) -> str:
    """The line for an exception psgd did not expect: its traceback is written to a file
    (printed already with ``debug``)."""
    head = f"this is a bug in psgd: {type(exc).__name__}: {exc}"
    if debug:
        return f"{head} (traceback above)"
    base = _traceback_base["path"] or os.path.join(tempfile.gettempdir(), f"psgd-{os.getpid()}")
    path = f"{base}.rank{rank}.traceback"
    try:
        with open(path, "w") as f:
            traceback.print_exception(exc, file=f)
    except OSError as err:
        return f"{head} (its traceback could not be written to {path}: {err}; --debug prints it)"
    return f"{head} (traceback in {path}; --debug prints it)"


def report_and_abort(exc: BaseException, *, debug: bool = False, code: int = 1,
                     values_are_usage: bool = False) -> None:
    """Print one line naming this rank and the cause, then end every rank of the job.

    A :class:`PsgdError` (and ``UsageError``) is its message; an OSError its type and
    message; a ValueError too where ``values_are_usage`` (the single-process commands,
    whose input parsing raises it); anything else is a bug in psgd (:func:`_bug`).
    Under MPI with more than one rank this calls ``MPI_Abort`` (after flushing the
    message), so no other rank is left hanging; alone it exits with ``code``.
    """
    rank, size = _rank_size()
    where = f"rank {rank}: " if size > 1 else ""
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, PsgdError) or values_are_usage and isinstance(exc, ValueError):
        msg = f"{type(exc).__name__}: {exc}" if debug else str(exc)
    elif isinstance(exc, OSError):
        msg = f"{type(exc).__name__}: {exc}"
    else:
        msg = _bug(exc, rank, debug)
    print(f"psgd: error: {where}{msg}", file=sys.stderr, flush=True)
    if size > 1:
        abort_job(code)
    sys.stdout.flush()
    sys.exit(code)


def abort_job(code: int = 1) -> None:
    """End every rank of the job with ``MPI_Abort`` (callable from any thread), after the
    message already printed has had a moment to get out, and after unlinking this node's shared
    memory (see :func:`unlink_mapped_shm`)."""
    from mpi4py import MPI

    sys.stdout.flush()
    unlink_mapped_shm()
    # the launcher forwards our stderr through a pipe it stops reading once the abort
    # reaches it: seen on a loaded node, the line was lost; give it a moment first
    time.sleep(ABORT_GRACE_S)
    MPI.COMM_WORLD.Abort(code)


def unlink_mapped_shm() -> list[str]:
    """Unlink the files in /dev/shm that this process maps (MPICH's node segment, shared windows).

    For a rank about to end the job with ``MPI_Abort``: no rank frees them
    then, and a segment left behind makes a later job of the same name wait in
    ``MPI_Init``. Every rank of the node has mapped them already; the mappings
    stay valid until the processes end. Returns the paths unlinked.
    """
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps
                     if "/dev/shm/" in line and not line.rstrip().endswith("(deleted)")}
    except OSError:
        return []
    gone = []
    for path in sorted(paths):
        try:
            os.unlink(path)
            gone.append(path)
        except OSError:
            pass
    return gone


def _rank_size() -> tuple[int, int]:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return 0, 1
    return mpi.COMM_WORLD.Get_rank(), mpi.COMM_WORLD.Get_size()
