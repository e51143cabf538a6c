"""MPI shared memory: whether ranks share a node, and allocating a window with one clear error."""
from __future__ import annotations

from mpi4py import MPI


def allocate_shared(comm: MPI.Intracomm, nbytes: int, disp_unit: int, what: str,
                    instead: str) -> MPI.Win:
    """``MPI_Win_allocate_shared`` of ``nbytes`` on this rank (collective over ``comm``).

    Raises
    ------
    RuntimeError
        "could not allocate WHAT (MPI's reason); free space in /dev/shm, or
        set INSTEAD", e.g. ``instead="PSGD_X_PS_PUSH_WINDOW=0 to push by
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
