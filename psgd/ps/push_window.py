"""Pushes within a node through shared memory: worker gradient buffers that servers read in place.

Each pushing worker's gradient buffer is its segment of a window that every rank
of the node maps; it computes the gradient there and sends only the push header,
and the server steps straight from that segment. Once the worker holds the replies
to a pull sent after its push, no server reads the segment any more, so a worker
that overlaps (pulls posted ahead) pushes by messages. Servers on other nodes get
messages; ``PSGD_X_PS_PUSH_WINDOW=0`` keeps every push to messages (same on all ranks).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.mpi import wait as _wait
from psgd.mpi.phase import phase
from psgd.mpi.shared_memory import allocate_shared


class PushWindow:
    """The node's window of worker gradient segments (collective over ``comm`` to make and free).

    Parameters
    ----------
    comm : MPI.Intracomm
        The job communicator; every rank of it makes the window, each node its own.
    n_floats : int
        float32 elements this rank contributes: the full vector on a worker
        that pushes through the window, 0 on a server or an overlapping worker.
    """

    def __init__(self, comm: MPI.Intracomm, n_floats: int) -> None:
        with phase("making the push window"):
            self._make(comm, n_floats)
        self._freed = False

    def _make(self, comm: MPI.Intracomm, n_floats: int) -> None:
        # MPICH's collectives busy-poll: meet first with psgd's sleeping barrier, so that a
        # server which gets here long before its workers (they load data first) does not
        # spin a core meanwhile
        _wait.barrier(comm, "the other ranks to set up the parameter server's push window")
        self.node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        self.group = comm.Get_group()
        self.node_group = self.node.Get_group()
        _wait.barrier(self.node, "the ranks of this node to set up the push window")
        self.win = allocate_shared(
            self.node, 4 * int(n_floats), 4, "the parameter server's shared-memory push window",
            f"PSGD_X_PS_PUSH_WINDOW=0 to push by messages only (each worker keeps its gradient "
            f"buffer in the window: {4 * n_floats / 2**20:.1f} MB on this rank)")
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.own = self._segment(self.node.Get_rank())

    def _segment(self, node_rank: int) -> np.ndarray:
        mem, _ = self.win.Shared_query(node_rank)
        return np.frombuffer(mem, np.float32)

    def node_rank(self, rank: int) -> int:
        """``rank`` of the job communicator in this node's communicator, or -1 off the node."""
        (r,) = MPI.Group.Translate_ranks(self.group, [rank], self.node_group)
        return -1 if r == MPI.UNDEFINED else r

    def segment(self, rank: int) -> np.ndarray | None:
        """The float32 segment of job rank ``rank``, or None when it is on another node."""
        r = self.node_rank(rank)
        return None if r < 0 else self._segment(r)

    def sync(self) -> None:
        """Order this rank's writes to / reads from the window around a message (``MPI_Win_sync``)."""
        self.win.Sync()

    def free(self) -> None:
        """Free the window (collective over the node; meets with a sleeping barrier first)."""
        if self._freed:
            return
        self._freed = True
        with phase("freeing the push window"):
            _wait.barrier(self.node, "the ranks of this node to finish with the push window")
            self.own = None   # the memory goes with the window
            self.win.Unlock_all()
            self.win.Free()
            self.group.Free()
            self.node_group.Free()
            self.node.Free()
