"""The rank grid of a pipeline: D data-parallel replicas x K stages (x T tensor parts), and the
communicators of each axis."""
from __future__ import annotations

from mpi4py import MPI

from psgd.mpi import wait


class Grid:
    """Rank ``r`` of ``comm`` is stage ``r % K`` of replica ``r // K``.

    Attributes
    ----------
    stages, replicas, stage, replica : int
    prev, next : int or None
        The neighbouring stages' ranks in :attr:`p2p` (None at the ends).
    p2p : MPI.Comm
        A duplicate of ``comm`` for the stages' activations and gradients.
    replica_comm : MPI.Comm
        The D ranks of this stage (all-reduce of its gradients).
    row_comm : MPI.Comm
        The K stages of this replica, ranked by stage (checkpoint parts, summaries).
    comm : MPI.Comm
        ``comm`` itself (every rank of the grid).
    """

    def __init__(self, comm: MPI.Comm, stages: int) -> None:
        size = comm.Get_size()
        if stages < 1 or size % stages:
            raise ValueError(f"--pipeline {stages}: the {size} ranks are not D replicas x "
                             f"{stages} stages (give a multiple of {stages} ranks)")
        rank = comm.Get_rank()
        self.comm = comm
        self.stages, self.replicas = stages, size // stages
        self.stage, self.replica = rank % stages, rank // stages
        self.prev = rank - 1 if self.stage > 0 else None
        self.next = rank + 1 if self.stage < stages - 1 else None
        self.p2p, req = comm.Idup()
        wait.wait(req, "the other ranks to set up the pipeline's communicator")
        self.replica_comm = comm.Split(self.stage, self.replica)
        self.row_comm = comm.Split(self.replica, self.stage)

    def free(self) -> None:
        for c in (self.p2p, self.replica_comm, self.row_comm):
            c.Free()


class TensorGrid(Grid):
    """D replicas x K stages x T tensor parts: rank ``r`` of ``comm`` is part ``r % T`` of
    stage ``(r // T) % K`` of replica ``r // (K T)``, so a stage's T parts are neighbouring
    ranks (their collectives run every layer; the stages' messages once per microbatch).

    As :class:`Grid`, but per part: :attr:`prev`/:attr:`next` are the same part of the
    neighbouring stages, :attr:`replica_comm` the D ranks of this (stage, part),
    :attr:`row_comm` the K stages of this (replica, part); :attr:`tensor_comm` is the T
    parts of this stage of this replica, ranked by part.
    """

    def __init__(self, comm: MPI.Comm, stages: int, parts: int) -> None:
        size = comm.Get_size()
        if stages < 1 or parts < 1 or size % (stages * parts):
            raise ValueError(f"--pipeline {stages} --tensor {parts}: the {size} ranks are not D "
                             f"replicas x {stages} stages x {parts} parts (give a multiple of "
                             f"{stages * parts} ranks)")
        rank = comm.Get_rank()
        self.comm, self.parts, self.part = comm, parts, rank % parts
        self.stages, self.replicas = stages, size // (stages * parts)
        self.stage, self.replica = (rank // parts) % stages, rank // (stages * parts)
        self.prev = rank - parts if self.stage > 0 else None
        self.next = rank + parts if self.stage < stages - 1 else None
        self.p2p, req = comm.Idup()
        wait.wait(req, "the other ranks to set up the pipeline's communicator")
        self.replica_comm = comm.Split(self.stage * parts + self.part, self.replica)
        self.row_comm = comm.Split(self.replica * parts + self.part, self.stage)
        self.tensor_comm = comm.Split(self.replica * stages + self.stage, self.part)

    def free(self) -> None:
        super().free()
        self.tensor_comm.Free()
