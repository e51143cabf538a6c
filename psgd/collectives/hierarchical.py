"""The hierarchical all-reduce of ranks on several nodes: shared window, leaders' ring, window.

Within each node the ranks sum through the node's shared-memory window; one
leader per node (its lowest rank) all-reduces the node sums with the ring or
recursive doubling; each leader then hands the total to its node through the
window (Horovod's and NCCL's pattern). Only the leaders cross the network, each
sending 2(K-1)/K of the buffer for K nodes instead of every rank doing so.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
from mpi4py import MPI

from psgd.mpi import wait as _wait


class NodeLayout:
    """``comm`` split by node: this rank's node communicator and, on leaders, the leaders'.

    Collective over ``comm`` to make (``MPI_COMM_TYPE_SHARED`` then a split of
    the node leaders) and to free.
    """

    __slots__ = ("node", "leaders", "nodes", "largest")

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
        leader = self.node.Get_rank() == 0
        leaders = comm.Split(0 if leader else MPI.UNDEFINED, comm.Get_rank())
        self.leaders = leaders if leader else None
        # (nodes, ranks on the largest node), the same on every rank
        counts = np.array([int(leader), self.node.Get_size()], np.int64)
        total = np.empty_like(counts)
        _wait.waitall([comm.Iallreduce(counts[:1], total[:1], op=MPI.SUM),
                       comm.Iallreduce(counts[1:], total[1:], op=MPI.MAX)],
                      "the other ranks (all-reduce node layout)")
        self.nodes, self.largest = int(total[0]), int(total[1])

    def free(self) -> None:
        if self.leaders is not None:
            self.leaders.Free()
        self.node.Free()


Reduce = Callable[[MPI.Intracomm, np.ndarray, str], None]   # (comm, buf, algorithm), summing


def hierarchical_allreduce(layout: NodeLayout, buf: np.ndarray, size: int, mean: bool,
                           reduce: Reduce, broadcast: Callable[[np.ndarray], None]) -> None:
    """Sum ``buf`` over all ``size`` ranks in place (collective over the layout's ranks).

    ``reduce(comm, buf, algorithm)`` is the flat all-reduce (sum) run on the node
    (``"shared"``) and across leaders (``"auto"``); ``broadcast(buf)`` copies node
    rank 0's buffer to its node. The leaders all hold the same total, so every
    rank ends with the same bits.
    """
    if layout.node.Get_size() > 1:
        reduce(layout.node, buf, "shared")
    if layout.leaders is not None:
        if layout.nodes > 1:
            reduce(layout.leaders, buf, "auto")
        if mean:
            np.divide(buf, size, out=buf)
    if layout.node.Get_size() > 1:
        broadcast(buf)
