"""Elastic asynchronous training: a server job that worker jobs join and leave while it trains."""
import os
import sys

SEGMENT_PREFIX = "/dev/shm/mpich_shm_"   # MPICH's shared-memory segment of a job's ranks


def no_cross_memory_attach() -> None:
    """Before MPI starts: keep UCX from reading a peer's memory in place (CMA). When a worker job
    dies while the servers read its push that way, UCX aborts the server job; its other
    shared-memory transports copy through a segment and leave the survivor standing. A
    UCX_TLS the user set is kept."""
    os.environ.setdefault("UCX_TLS", "^cma")


def mapped_segments() -> list[str]:
    """The MPICH shared-memory segments this process maps (from /proc/self/maps; none where
    there is no /proc)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            paths = {line.split()[-1] for line in fh if SEGMENT_PREFIX in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith(SEGMENT_PREFIX))


def leave(code: int) -> None:
    """End this process now, with exit status ``code``: by ``os._exit``, since MPI_Finalize could
    wait on a dead peer; first flush, and unlink the job's MPICH segment in /dev/shm, which
    only MPI_Finalize would remove (every rank of the job does, after the others are done)."""
    sys.stdout.flush()
    sys.stderr.flush()
    for path in mapped_segments():
        try:
            os.unlink(path)
        except OSError:
            pass
    os._exit(code)
