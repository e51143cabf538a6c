"""Pushes within a node through shared memory: a worker's gradient buffer that its node's servers read in place.

A push between two ranks of one node is a copy through shared memory either
way: MPICH moves a large message with a receiver-side ``process_vm_readv``
(CMA), so a server spends as long receiving a 4 MB push (0.4-0.6 ms) as
stepping its shard with it (0.5 ms).  With the push window, each worker's
gradient buffer is its segment of a window that every rank of the node maps
(``MPI_Win_allocate_shared``); the worker computes its gradient there and
sends only the push header, and the server steps straight from the worker's
segment, with no copy at all.

Measured with ``bench_ps.py --child ps`` (1M floats, 2 workers, no compute,
window and ``--messages`` alternating, five pairs each, on the 2-core test
VM), push + pull MB/s:

* 1 server: bsp 3191-5655 through the window against 2147-3657 by messages
  (medians 4566 / 2940), asp 3473-7900 against 3989-5555 (4526 / 4273);
* 2 servers: bsp 4746-6257 against 4311-4732 (5981 / 4482), asp 5541-6300
  against 3822-4855 (6122 / 4639).

The server's CPU per update falls too (bench_ps's asp, 1 server: busy 0.69-0.72
of the wall time against 0.88-0.90).  A worker that copies its gradient into
the window first, instead of computing it there, was slower than messages in
a prototype (4.9-5.6 against 6.5-7.2 GB/s), so only a gradient computed in the
window goes through it.

The servers read the segment between the worker's header and their answer
to the worker's next pull: a server takes a worker's messages in order;
asp/ssp step a push as they take it, and bsp reads it at the latest in the
step that advances the version, before it answers a pull of the next clock
(:class:`psgd.ps.bsp.BspUpdate`'s lent pushes).  So once a worker
holds the replies to a pull sent after its push, no server reads its buffer
any more: :meth:`psgd.ps.worker.PSWorker.step` returns then,
and the buffer is free again, as with messages.  A pull posted ahead
(``overlap``) is sent before the push and proves nothing, so a worker that
overlaps pushes by messages.  ``MPI_Win_sync`` after the worker's last write
and before the server's first read orders the two on weakly ordered CPUs.

Servers on another node still get the gradient as a message (the worker
decides per server, the header says which).  ``PSGD_PS_PUSH_WINDOW=0`` keeps
every push to messages (:class:`psgd.config.ProtocolConfig`'s
``push_window``); it must be the same on every rank, since making the window
is collective.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.mpi import wait as _wait
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
            f"PSGD_PS_PUSH_WINDOW=0 to push by messages only (each worker keeps its gradient "
            f"buffer in the window: {4 * n_floats / 2**20:.1f} MB on this rank)")
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.own = self._segment(self.node.Get_rank())
        self._freed = False

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
        _wait.barrier(self.node, "the ranks of this node to finish with the push window")
        self.own = None   # the memory goes with the window
        self.win.Unlock_all()
        self.win.Free()
        self.group.Free()
        self.node_group.Free()
        self.node.Free()
