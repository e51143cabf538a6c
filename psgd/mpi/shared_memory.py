"""Allocating an MPI shared-memory window, with one clear error when ``/dev/shm`` has no room."""
from __future__ import annotations

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
