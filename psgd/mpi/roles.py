"""Rank roles: ranks 0..S-1 are parameter servers, the rest are workers sharing a sub-communicator."""
from __future__ import annotations

import os
from dataclasses import dataclass

from mpi4py import MPI


@dataclass
class Roles:
    """Who this rank is.

    Attributes
    ----------
    comm : MPI.Comm
        The job's communicator (all servers and workers).
    rank, size : int
        This rank and the job size in ``comm``.
    n_servers, n_workers : int
        S and W = size - S.
    worker_comm : MPI.Comm or None
        Communicator of the workers only (None on servers); worker ``k`` is rank
        ``k`` of it and rank ``S + k`` of ``comm``.
    """

    comm: MPI.Comm
    rank: int
    size: int
    n_servers: int
    n_workers: int
    worker_comm: MPI.Comm | None

    @property
    def is_server(self) -> bool:
        return self.rank < self.n_servers

    @property
    def is_worker(self) -> bool:
        return self.rank >= self.n_servers

    @property
    def worker_index(self) -> int:
        """Index of this worker in 0..W-1 (only meaningful on workers)."""
        return self.rank - self.n_servers

    @property
    def server_index(self) -> int:
        """Index of this server in 0..S-1, which is also its shard id (servers only)."""
        return self.rank

    @property
    def lead_worker(self) -> int:
        """Rank in ``comm`` of worker 0, which logs, evaluates and shows progress."""
        return self.n_servers

    def server_rank(self, shard: int) -> int:
        return shard

    def worker_rank(self, index: int) -> int:
        return self.n_servers + index


def check_servers(n_servers: int, size: int) -> None:
    """Raise ValueError unless 0 <= S < size (at least one worker is left)."""
    if n_servers < 0:
        raise ValueError(f"--servers must be >= 0, got {n_servers}")
    if n_servers >= size:
        raise ValueError(f"--servers {n_servers} leaves no worker: the job has {size} rank(s); "
                         f"launch with mpiexec -n {n_servers + 1} or more{_singleton_hint(size)}")


def _singleton_hint(size: int) -> str:
    """Why srun may have started this task alone: MPI found no PMI it speaks."""
    tasks = os.environ.get("SLURM_NTASKS", "")
    if size != 1 or not tasks.isdigit() or int(tasks) <= 1:
        return ""
    return (f"; Slurm started {tasks} tasks but MPI sees each alone: srun found no PMI "
            f"this MPI speaks, use srun --mpi=pmi2 (MPICH) or --mpi=pmix (Open MPI)")


def assign_roles(comm: MPI.Comm, n_servers: int) -> Roles:
    """Split ``comm`` into S servers and W workers (collective over ``comm``).

    Raises
    ------
    ValueError
        If S < 0 or S >= size (no worker would be left).
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    check_servers(n_servers, size)
    is_worker = rank >= n_servers
    worker_comm = comm.Split(1 if is_worker else MPI.UNDEFINED, rank)
    if worker_comm == MPI.COMM_NULL:
        worker_comm = None
    return Roles(comm=comm, rank=rank, size=size, n_servers=n_servers,
                 n_workers=size - n_servers, worker_comm=worker_comm)
