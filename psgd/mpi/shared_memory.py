"""MPI shared memory: whether ranks share a node, allocating a window with one clear error, unlinking at an abort."""
from __future__ import annotations

import os

from mpi4py import MPI


def allocate_shared(comm: MPI.Intracomm, nbytes: int, disp_unit: int, what: str,
                    instead: str) -> MPI.Win:
    """``MPI_Win_allocate_shared`` of ``nbytes`` on this rank (collective over ``comm``).

    Raises
    ------
    RuntimeError
        "could not allocate WHAT (MPI's reason); free space in /dev/shm, or
        set INSTEAD", e.g. ``instead="PSGD_PS_PUSH_WINDOW=0 to push by
        messages only"``.
    """
    try:
        return MPI.Win.Allocate_shared(nbytes, disp_unit, comm=comm)
    except MPI.Exception as exc:
        why = exc.Get_error_string().strip().splitlines()[-1].rsplit(":", 1)[-1].strip()
        raise RuntimeError(f"could not allocate {what} ({why}); free space in /dev/shm, or set "
                           f"{instead}") from exc


def on_one_node(comm: MPI.Intracomm) -> bool:
    """Whether every rank of ``comm`` shares one node (``MPI_COMM_TYPE_SHARED``; collective)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == comm.Get_size()
    finally:
        node.Free()


def unlink_mapped() -> list[str]:
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
