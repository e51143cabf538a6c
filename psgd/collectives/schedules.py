"""The all-reduce's message schedules, recursive doubling and the ring, built once per buffer.

A schedule is every message one rank sends and receives in an all-reduce of one
buffer, made up front as MPI persistent requests with the slices they move and the
adds they feed; a call only starts requests, tests them and adds.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.env import env_float
from psgd.mpi import wait as _wait

# Tags on the all-reduce's private communicator: recursive doubling uses the first
# three, the ring t + 2s (reduce-scatter step s) and t + 1 + 2s (all-gather step s), t = 16
# unless its caller picks another t to keep two rings in flight apart.
_TAG_FOLD, _TAG_DOUBLE, _TAG_UNFOLD = 3, 4, 5
_TAG_RS = 16

# A wait polls a few times, then polls with sched_yield for up to this long before
# psgd.mpi.wait's backoff sleeps: the peer is inside the same call, so due within
# microseconds, and sched_yield hands the core straight to a rank that shares it.
DEFAULT_SPIN_S = 5e-3
SPIN_S = env_float("PSGD_X_ALLREDUCE_SPIN_US", DEFAULT_SPIN_S * 1e6) * 1e-6
POLLS = 4                                  # bare polls before the yield spin


def complete_all(requests: list, what) -> None:
    """Complete all requests: a few bare polls (small messages land within microseconds),
    a yield spin of up to ``SPIN_S``, then psgd.mpi.wait's backoff sleeps and stall report."""
    testall = MPI.Request.Testall
    for _ in range(POLLS):
        if testall(requests):
            return
    _wait.waitall(requests, what, spin_s=SPIN_S)


def complete(request: MPI.Request, what) -> None:
    """One request, as :func:`complete_all`."""
    test = request.Test
    for _ in range(POLLS):
        if test():
            return
    _wait.wait(request, what, spin_s=SPIN_S)


class Schedule:
    """Persistent requests over one buffer; holds the buffer, so its id stays unique while cached."""

    __slots__ = ("buf", "requests")

    def __init__(self, buf: np.ndarray) -> None:
        self.buf = buf
        self.requests: list[MPI.Prequest] = []

    def _keep(self, request: MPI.Prequest) -> MPI.Prequest:
        self.requests.append(request)
        return request

    def free(self) -> None:
        for request in self.requests:
            request.Free()
        self.requests = []


class DoublingSchedule(Schedule):
    """Sum in place by recursive doubling; N not a power of two folds the first 2r ranks in pairs.

    With p the largest power of two <= N and r = N - p, ranks 0..2r-1 pair up:
    each even one hands its buffer to the odd one above it and sits out;
    the p remaining ranks exchange-and-add with partners at distance 1, 2, 4, ...
    (both partners compute the same a+b, so all stay bitwise identical); then
    each odd rank hands the result back to its even partner.  floor(log2 N)
    exchanges of the whole buffer (+2 when N is not a power of two).
    """

    __slots__ = ("scratch", "stages")

    def __init__(self, comm: MPI.Comm, buf: np.ndarray) -> None:
        super().__init__(buf)
        rank, size = comm.Get_rank(), comm.Get_size()
        p = 1 << (size.bit_length() - 1)
        rem = size - p
        self.scratch = scratch = np.empty_like(buf)
        # a stage: (requests, add scratch into buf after?, peer, what)
        self.stages: list[tuple[list, bool, int, str]] = []

        def stage(requests, add, peer, what):
            self.stages.append(([self._keep(r) for r in requests], add, peer, what))

        if rank < 2 * rem and rank % 2 == 0:
            stage([comm.Send_init(buf, rank + 1, _TAG_FOLD)], False, rank + 1, "fold")
            stage([comm.Recv_init(buf, rank + 1, _TAG_UNFOLD)], False, rank + 1, "result")
            return
        if rank < 2 * rem:
            stage([comm.Recv_init(scratch, rank - 1, _TAG_FOLD)], True, rank - 1, "fold")
            vrank = rank // 2
        else:
            vrank = rank - rem
        mask = 1
        while mask < p:
            vpartner = vrank ^ mask
            partner = 2 * vpartner + 1 if vpartner < rem else vpartner + rem
            stage([comm.Recv_init(scratch, partner, _TAG_DOUBLE),
                   comm.Send_init(buf, partner, _TAG_DOUBLE)], True, partner, "recursive doubling")
            mask <<= 1
        if rank < 2 * rem:
            stage([comm.Send_init(buf, rank - 1, _TAG_UNFOLD)], False, rank - 1, "result")

    def run(self, label: str) -> None:
        buf, scratch = self.buf, self.scratch
        startall = MPI.Prequest.Startall
        for requests, add, peer, what in self.stages:
            startall(requests)
            complete_all(requests, lambda: f"rank {peer} (all-reduce {what}{label})")
            if add:
                np.add(buf, scratch, out=buf)


class RingSchedule(Schedule):
    """Ring reduce-scatter then all-gather, pipelined in segments across steps.

    The buffer is cut into N chunks and each chunk into the same number K of
    segments of at most ``seg`` elements.  Reduce-scatter step s sends chunk
    rank-s and receives chunk rank-s-1 from the left; as soon as segment k of
    step s is received and added in, segment k of step s+1 (that very slice)
    goes out to the right, so later steps flow while earlier ones finish.
    Receives complete in (step, segment) order, so sends leave in the order the
    right neighbour receives (one tag per step).  One reduce-scatter receive is
    posted at a time, into a one-segment scratch: MPICH copies a large message
    (CMA, by the receiver) when its receive matches, so the segment is still in
    cache when added.  The all-gather
    forwards chunks the same way, received in place.  Each rank sends 2(N-1)/N
    of the buffer.
    """

    __slots__ = ("rs_send0", "rs_recv", "rs_add", "rs_fwd", "own", "ag_send0", "ag_recv",
                 "ag_fwd", "left", "right", "size")

    def __init__(self, comm: MPI.Comm, buf: np.ndarray, seg: int, tags: int = _TAG_RS) -> None:
        super().__init__(buf)
        rank, size = comm.Get_rank(), comm.Get_size()
        n = buf.size
        self.size = size
        tag_rs, tag_ag = tags, tags + 1         # another ``tags`` keeps two rings apart
        self.right, self.left = right, left = (rank + 1) % size, (rank - 1) % size
        steps = size - 1
        bounds = [(i * n) // size for i in range(size + 1)]
        nseg = max(1, -(-(n // size) // seg))
        cap = -(-(-(-n // size)) // nseg)           # longest segment of any chunk
        scratch = np.empty(cap, buf.dtype)

        def piece(chunk: int, k: int) -> slice:
            a, length = bounds[chunk], bounds[chunk + 1] - bounds[chunk]
            return slice(a + (k * length) // nseg, a + ((k + 1) * length) // nseg)

        def send(chunk, k, tag):
            return self._keep(comm.Send_init(buf[piece(chunk, k)], right, tag))

        # reduce-scatter: afterwards this rank holds the full sum of chunk rank+1
        self.rs_send0 = [send(rank, k, tag_rs) for k in range(nseg)]
        self.rs_recv, self.rs_add, self.rs_fwd = [], [], []
        for s in range(steps):
            chunk = (rank - s - 1) % size
            for k in range(nseg):
                part = buf[piece(chunk, k)]
                self.rs_recv.append(self._keep(comm.Recv_init(scratch[:part.size], left,
                                                              tag_rs + 2 * s)))
                self.rs_add.append((part, scratch[:part.size]))
                self.rs_fwd.append(send(chunk, k, tag_rs + 2 * (s + 1)) if s + 1 < steps else None)
        own = (rank + 1) % size
        self.own = buf[bounds[own]:bounds[own + 1]]
        # all-gather: step s forwards chunk rank+1-s and receives chunk rank-s in place
        self.ag_send0 = [send(own, k, tag_ag) for k in range(nseg)]
        self.ag_recv, self.ag_fwd = [], []
        for s in range(steps):
            chunk = (rank - s) % size
            for k in range(nseg):
                self.ag_recv.append(self._keep(comm.Recv_init(buf[piece(chunk, k)], left,
                                                              tag_ag + 2 * s)))
                self.ag_fwd.append(send(chunk, k, tag_ag + 2 * (s + 1)) if s + 1 < steps else None)

    def run(self, mean: bool, label: str) -> None:
        for request, what in self.steps(mean, label):
            complete(request, what)

    def steps(self, mean: bool, label: str):
        """The ring as a generator: yields (request, describe) for each request it waits on and
        resumes once the caller has completed it, so a caller can run several rings at once."""
        startall = MPI.Prequest.Startall
        left, right = self.left, self.right
        what_left = lambda: f"rank {left} (ring all-reduce{label}, left neighbour)"    # noqa: E731
        what_right = lambda: f"rank {right} (ring all-reduce{label}, right neighbour)"  # noqa: E731
        startall(self.rs_send0)
        sends = list(self.rs_send0)
        recvs, adds, fwds = self.rs_recv, self.rs_add, self.rs_fwd
        last = len(recvs) - 1
        recvs[0].Start()
        for i, recv in enumerate(recvs):
            yield recv, what_left
            part, got = adds[i]
            np.add(part, got, out=part)
            if fwds[i] is not None:
                fwds[i].Start()
                sends.append(fwds[i])
            if i < last:
                recvs[i + 1].Start()                 # the scratch is free again
        if mean:
            np.divide(self.own, self.size, out=self.own)
        # the reduce-scatter never sent chunk `own`, so it leaves at once; the chunks it
        # did send are received into next, so those sends must be complete first
        startall(self.ag_send0)
        for send in sends:
            yield send, what_right
        sends = list(self.ag_send0)
        startall(self.ag_recv)
        for recv, fwd in zip(self.ag_recv, self.ag_fwd):
            yield recv, what_left
            if fwd is not None:
                fwd.Start()
                sends.append(fwd)
        for send in sends:
            yield send, what_right
