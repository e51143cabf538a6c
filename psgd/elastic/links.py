"""The servers' view of joined workers: one intercommunicator per worker, addressed as job ranks.

:class:`Links` stands in for the job communicator of :mod:`psgd.ps.server`: rank ``S + w``
is the one remote rank of worker ``w``'s intercommunicator (from ``MPI_Comm_accept``), and
ranks below S are the server job's own. So the server loop, its messages and its update
rule run unchanged, each worker isolated on its own intercommunicator.
"""
from __future__ import annotations

import time

from mpi4py import MPI


class WorkerLost(Exception):
    """A message of worker ``w`` that was due never came (its link is silent); ``aside``: the
    buffer a receive of it was left pending into (MPI may still write it: never reuse it)."""

    def __init__(self, w: int, aside=None) -> None:
        super().__init__(f"worker {w} went silent")
        self.w, self.aside = w, aside


class Links:
    """A communicator-like object over the server job's ranks and the workers' links.

    Parameters
    ----------
    comm : MPI.Comm
        The server job's communicator (S ranks, all servers).
    slots : int
        The most workers that may join over the run (slot ``w`` is rank ``S + w``).
    silence_s : float
        A message due from a worker (a push's payload after its header) that has not come
        this long after the worker's last one raises :class:`WorkerLost`.
    """

    def __init__(self, comm: MPI.Comm, slots: int, silence_s: float) -> None:
        self.comm, self.S = comm, comm.Get_size()
        self.slots, self.silence_s = int(slots), float(silence_s)
        self.inter: list = [None] * self.slots   # None: not joined, or dropped
        self.heard = [0.0] * self.slots           # time.monotonic() of the last message
        self.live: list[int] = []                 # joined and not dropped, in join order
        self.gone: dict = {}                      # dropped: their links, until told so
        self.aside: list = []                     # (request, buffer) of abandoned receives
        self._next = 0                            # round-robin start of an any-source probe

    def Get_rank(self) -> int:   # noqa: N802 - mpi4py's names
        return self.comm.Get_rank()

    def Get_size(self) -> int:   # noqa: N802
        return self.S + self.slots

    def add(self, w: int, inter: MPI.Intercomm) -> None:
        """Worker ``w`` joined over ``inter``."""
        self.inter[w] = inter
        self.heard[w] = time.monotonic()
        self.live.append(w)

    def drop(self, w: int, lost: bool = False) -> None:
        """Forget worker ``w``: the loop probes no message of it again (its link stays open: a
        disconnect would wait on the worker); ``lost``: kept in ``gone``, to tell it."""
        if lost:
            self.gone[w] = self.inter[w]
        self.inter[w] = None
        if w in self.live:
            self.live.remove(w)

    def Improbe(self, source: int, tag: int, status: MPI.Status):   # noqa: N802
        """``MPI_Improbe`` on the rank ``source`` names (any source: every live link, then
        the servers); the status carries the job rank of the sender."""
        if source == MPI.ANY_SOURCE:
            n = len(self.live)
            for i in range(n):
                w = self.live[(self._next + i) % n]
                msg = self._probe(w, tag, status)
                if msg is not None:
                    self._next = (self._next + i + 1) % max(n, 1)
                    return msg
            return self.comm.Improbe(MPI.ANY_SOURCE, tag, status)
        if source < self.S:
            return self.comm.Improbe(source, tag, status)
        w = source - self.S
        msg = self._probe(w, tag, status) if self.inter[w] is not None else None
        if msg is None:
            self.check_heard(w)
            return None
        return _Watched(msg, self, w)

    def check_heard(self, w: int, aside=None) -> None:
        """Raise :class:`WorkerLost` when worker ``w`` has been silent past ``silence_s``."""
        if time.monotonic() - self.heard[w] > self.silence_s:
            raise WorkerLost(w, aside)

    def pardon(self, but: int) -> None:
        """The loop was held by worker ``but``'s receive, so no other link was probed: every
        other live worker's silence counts from now."""
        now = time.monotonic()
        for w in self.live:
            if w != but:
                self.heard[w] = max(self.heard[w], now)

    def _probe(self, w: int, tag: int, status: MPI.Status):
        msg = self.inter[w].Improbe(0, tag, status)
        if msg is not None:
            status.Set_source(self.S + w)
            self.heard[w] = time.monotonic()
        return msg

    def Isend(self, buf, dest: int, tag: int) -> MPI.Request:   # noqa: N802
        """``MPI_Isend`` to job rank ``dest`` (a server, or a joined worker's link)."""
        if dest < self.S:
            return self.comm.Isend(buf, dest, tag)
        return self.inter[dest - self.S].Isend(buf, 0, tag)


class _Watched:
    """A message of worker ``w`` matched by a probe of its rank: its receive raises
    :class:`WorkerLost` when the data stops coming (a sender killed mid-transfer leaves a
    matched rendezvous receive that never completes)."""

    def __init__(self, msg: MPI.Message, links: Links, w: int) -> None:
        self.msg, self.links, self.w = msg, links, w

    def Recv(self, buf) -> None:   # noqa: N802
        self.msg.Recv(buf)

    def Irecv(self, buf) -> "_Receiving":   # noqa: N802
        return _Receiving(self.msg.Irecv(buf), self.links, self.w, buf)


class _Receiving:
    """The request of a :class:`_Watched` receive, for :func:`psgd.mpi.wait.wait`."""

    def __init__(self, req: MPI.Request, links: Links, w: int, buf) -> None:
        self.req, self.links, self.w, self.buf = req, links, w, buf

    def Test(self, status: MPI.Status | None = None) -> bool:   # noqa: N802
        if self.req.Test(status):
            self.links.heard[self.w] = time.monotonic()
            return True
        try:
            self.links.check_heard(self.w, self.buf)
        except WorkerLost:
            self.links.aside.append((self.req, self.buf))   # kept alive, never waited on
            self.links.pardon(but=self.w)
            raise
        return False
