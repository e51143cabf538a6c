"""Elastic asynchronous training: a server job that worker jobs join and leave while it trains."""
import os
import sys
import threading
import time

SEGMENT_PREFIX = "/dev/shm/mpich_shm_"   # MPICH's shared-memory segment of a job's ranks
STALE_AGE_S = 60.0   # a segment younger than this may be a starting job's, not yet mapped
RING_UCX_TLS = "posix,sysv,self"   # an elastic ring's UCX transports: shared memory only
FINALIZE_S = 5.0   # Open MPI: how long leave() gives MPI_Finalize


def no_cross_memory_attach(protocol: str | None = None) -> None:
    """Before MPI starts: keep UCX from reading a peer's memory in place (CMA). When a worker job
    dies while the servers read its push that way, UCX aborts the server job; its other
    shared-memory transports copy through a segment and leave the survivor standing. Merged
    jobs (``protocol`` :func:`merged`) take shared memory only
    (RING_UCX_TLS: the tcp lane crashed survivors, docs/design/elastic.md). A UCX_TLS the
    user set is kept."""
    from psgd.protocols import PROTOCOLS   # imports no MPI
    ring = protocol in PROTOCOLS and merged(PROTOCOLS[protocol])
    os.environ.setdefault("UCX_TLS", RING_UCX_TLS if ring else "^cma")


def merged(protocol) -> bool:
    """Whether ``protocol`` (a registry entry) runs elastic as worker jobs merged into one
    communicator with a coordinator (a ring, adpsgd's pairs, or hogwild's windows), not with
    servers."""
    return (protocol.can("elastic-ring") or protocol.can("elastic-pairs")
            or protocol.can("elastic-windows"))


def mapped_segments() -> list[str]:
    """The MPICH shared-memory segments this process maps (from /proc/self/maps; none where
    there is no /proc)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            paths = {line.split()[-1] for line in fh if SEGMENT_PREFIX in line}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith(SEGMENT_PREFIX))


def segments_of(pid: int) -> list[str]:
    """The MPICH shared-memory segments process ``pid`` maps (none when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as fh:
            return sorted({line.split()[-1] for line in fh if SEGMENT_PREFIX in line})
    except OSError:
        return []


def unlink_unmapped(paths) -> list[str]:
    """Unlink those of ``paths`` (MPICH segments of a process that ended) that no process of
    this user maps; the paths removed."""
    paths = [p for p in paths if p.startswith(SEGMENT_PREFIX) and os.path.exists(p)]
    if not paths:
        return []
    mapped = _mapped_by_mine()
    removed = []
    for path in paths:
        if path not in mapped:
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return removed


def _mapped_by_mine() -> set[str]:
    """The MPICH segments any process of this user maps (one whose maps cannot be read, such
    as a non-dumpable process, is taken to map none: MPI ranks are readable)."""
    mapped, uid = set(), os.getuid()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/maps", encoding="utf-8") as fh:
                mapped.update(line.split()[-1] for line in fh if SEGMENT_PREFIX in line)
        except OSError:   # it ended meanwhile, or hides its maps
            continue
    return mapped


def remove_stale_segments(min_age_s: float = STALE_AGE_S) -> list[str]:
    """Unlink this user's MPICH segments in /dev/shm that no process maps any more (left by
    a SIGKILLed job, which nothing of it unlinks) and older than ``min_age_s``; the paths
    removed (none where there is no /proc)."""
    shm, now = os.path.dirname(SEGMENT_PREFIX), time.time()
    try:
        names = os.listdir(shm)
    except OSError:
        return []
    old = []
    for name in names:
        path = os.path.join(shm, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (path.startswith(SEGMENT_PREFIX) and st.st_uid == os.getuid()
                and now - max(st.st_mtime, st.st_ctime) > min_age_s):
            old.append(path)
    if not old or not os.path.isdir("/proc/self"):
        return []
    mapped = _mapped_by_mine()
    removed = [p for p in old if p not in mapped]
    for path in removed:
        try:
            os.unlink(path)
        except OSError:
            pass
    return removed


def tidy_shm() -> None:
    """At a job's start: :func:`remove_stale_segments`, said in one line when there were any."""
    removed = remove_stale_segments()
    if removed:
        print(f"psgd: removed {len(removed)} MPICH segment(s) of killed jobs from /dev/shm "
              f"(no process mapped them)", flush=True)


def leave(code: int) -> None:
    """End this process now, with exit status ``code``: by ``os._exit``, since MPI_Finalize could
    wait on a dead peer; first flush, and unlink the job's MPICH segment in /dev/shm, which
    only MPI_Finalize would remove (every rank of the job does, after the others are done).
    Under Open MPI (MPI started, called from the main thread), MPI_Finalize is tried first for
    up to FINALIZE_S: its mpirun reports a process that ends without it as an abnormal end, and
    exits 1 whatever ``code`` was."""
    sys.stdout.flush()
    sys.stderr.flush()
    for path in mapped_segments():
        try:
            os.unlink(path)
        except OSError:
            pass
    MPI = sys.modules.get("mpi4py.MPI")   # None: this process never imported MPI
    main = threading.current_thread() is threading.main_thread()
    if (MPI is not None and main and MPI.Is_initialized() and not MPI.Is_finalized()
            and "Open MPI" in MPI.Get_library_version()):
        finalize = threading.Thread(target=MPI.Finalize, daemon=True)
        finalize.start()
        finalize.join(FINALIZE_S)   # still waiting (on a dead peer?): leave all the same
    os._exit(code)
