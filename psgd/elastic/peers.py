"""What the server ranks of an elastic run tell each other: a join, a drop, the end.

Server rank 0 (the lead) admits joiners and ends the run; any server that finds a worker
lost tells the others, so every shard drops it. A message is int64 ``(kind, worker, clock)``
on the server job's own communicator, read between the servers' messages.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

TAG_PEER = 7202
ADMIT, DROP, END = 1, 2, 3


class Peers:
    """Point-to-point notes among the S server ranks of ``comm`` (none when S = 1)."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm, self.rank = comm, comm.Get_rank()
        self.others = [r for r in range(comm.Get_size()) if r != self.rank]
        self.sent: list = []   # (buffer, request): kept until complete
        self.status = MPI.Status()

    def tell(self, kind: int, worker: int = -1, clock: int = 0) -> None:
        """Send ``(kind, worker, clock)`` to every other server."""
        self.sent = [(b, r) for b, r in self.sent if not r.Test()]
        for dest in self.others:
            buf = np.array([kind, worker, clock], np.int64)
            self.sent.append((buf, self.comm.Isend(buf, dest, TAG_PEER)))

    def heard(self) -> list[tuple[int, int, int, int]]:
        """The notes that arrived: ``(kind, worker, clock, from rank)``, in arrival order."""
        notes = []
        while self.others and (msg := self.comm.Improbe(MPI.ANY_SOURCE, TAG_PEER,
                                                        self.status)) is not None:
            buf = np.empty(3, np.int64)
            msg.Recv(buf)
            notes.append((int(buf[0]), int(buf[1]), int(buf[2]), self.status.Get_source()))
        return notes
