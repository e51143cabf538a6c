"""The members of an elastic allreduce run: worker jobs merged into one communicator with the
coordinator (rank 0), each clock summing the gradients of the members still alive.

Members watch each other's pids (:func:`psgd.elastic.alive.running`; one node only). On a
death every survivor cancels its receive and reports its clock to the coordinator, which
names the new ring, the clock to redo and the member whose finished sum of it stands
(:mod:`psgd.elastic.ring_serve`, docs/design/elastic.md).
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from psgd.elastic.alive import running
from psgd.errors import PsgdError

REPORT, DECIDE, RESULT, DONE, END = 1, 2, 3, 4, 5   # tags between members and coordinator
TAG_RING = 16
LOOK_S = 0.005   # how often a waiting member looks at the others' pids


class Lost(Exception):
    """A member (or the coordinator) ended while this one summed a clock."""


class RingBroken(PsgdError):
    """The coordinator, or the member a result was due from, is gone: this member ends."""


def ring_tag(epoch: int, clock: int, step: int) -> int:
    """The tag of one pass-along message: the ring's epoch, the clock and the step (a message
    of an abandoned sum never matches a later one)."""
    return TAG_RING + ((epoch % 64) * 4096 + clock % 4096) * 64 + step % 64


class Ring:
    """The live members of ``comm`` (ranks 1..W at first) and the sum of a vector over them.

    ``pids``: every rank's process id (rank 0: the coordinator); ``fault``: tests
    (PSGD_X_FAULT), fired at its clock after a sum's first send is posted, or at its phase
    ``ring sum of clock C step S`` after that step's send is posted (``... before step S``:
    before it).
    """

    def __init__(self, comm: MPI.Intracomm, pids: list, fault=None) -> None:
        self.comm, self.pids, self.fault = comm, pids, fault
        self.rank = comm.Get_rank()
        self.members, self.epoch = list(range(1, comm.Get_size())), 0
        self.orphans: list = []   # what an abandoned sum left pending (MPI may still touch it)
        self.next_look = 0.0

    def alive(self) -> bool:
        """Whether the coordinator and every member run."""
        return all(running(self.pids[r]) for r in [0, *self.members])

    def sum(self, x: np.ndarray, clock: int) -> np.ndarray:
        """The sum of every member's ``x`` (pass each received vector on, n - 1 times), added
        in the ring's order so that every member holds the same bits; :class:`Lost` when a
        member ends meanwhile."""
        ring, n = self.members, len(self.members)
        i = ring.index(self.rank)
        nxt, prv = ring[(i + 1) % n], ring[i - 1]
        parts = {self.rank: np.array(x, copy=True)}
        out = parts[self.rank]
        for step in range(n - 1):
            if not running(self.pids[nxt]):   # a send to a peer dead for long can crash MPICH
                raise Lost
            if self.fault is not None:
                self.fault.at_phase(f"ring sum of clock {clock} before step {step}")
            got, tag = np.empty_like(out), ring_tag(self.epoch, clock, step)
            reqs = [self.comm.Irecv(got, source=prv, tag=tag),
                    self.comm.Isend(out, dest=nxt, tag=tag)]
            if self.fault is not None:
                self.fault.at_phase(f"ring sum of clock {clock} step {step}")
                if step == 0:
                    self.fault.at(clock)
            self._wait(reqs, (got, out))
            parts[ring[(i - 1 - step) % n]] = out = got
        total = np.zeros_like(out)
        for r in ring:
            total += parts[r]
        return total

    def _wait(self, reqs: list, bufs: tuple) -> None:
        try:
            while not MPI.Request.Testall(reqs):
                now = time.monotonic()
                if now >= self.next_look:
                    self.next_look = now + LOOK_S
                    if not self.alive():
                        raise Lost
                time.sleep(0)
        except (Lost, MPI.Exception) as why:
            try:
                if reqs[0]:   # the receive; a completed request is already null
                    reqs[0].Cancel()
            except MPI.Exception:
                pass
            self.orphans.append((reqs, bufs))
            raise Lost from why

    def recv(self, source: int, tag: int):
        """A pickled message from ``source`` (polled: :class:`RingBroken` once the coordinator,
        or ``source``, has ended)."""
        status = MPI.Status()
        while not self.comm.Iprobe(source, tag, status):
            if not (running(self.pids[0]) and running(self.pids[source])):
                raise RingBroken("the coordinator, or a member this one waited for, ended")
            time.sleep(LOOK_S)
        return self.comm.recv(source=source, tag=tag)

    def take(self, source: int, tag: int):
        """A pickled message from member ``source``; :class:`Lost` once ``source`` has ended
        before it came whole (what is pending is kept: MPI may still touch it)."""
        while (message := self.comm.improbe(source, tag)) is None:
            if not running(self.pids[0]):
                raise RingBroken("the coordinator ended")
            if not running(self.pids[source]):
                if (message := self.comm.improbe(source, tag)) is None:
                    raise Lost
                break
            time.sleep(LOOK_S)
        request = message.irecv()
        while not (got := request.test())[0]:
            if not running(self.pids[source]):
                if (got := request.test())[0]:   # it came whole: testing again would give None
                    break
                self.orphans.append(([request], ()))
                raise Lost
            time.sleep(LOOK_S)
        return got[1]

    def give(self, obj, dests: list, fault_phase: str | None = None) -> None:
        """Send a pickled ``obj`` to each live member of ``dests`` at once (a send to a member
        that ends meanwhile is left pending, kept); ``fault_phase``: tests (PSGD_X_FAULT),
        fired once the sends are posted."""
        posted = [(r, self.comm.isend(obj, dest=r, tag=RESULT)) for r in dests
                  if running(self.pids[r])]   # a send to a peer dead for long can crash MPICH
        if self.fault is not None and fault_phase is not None:
            self.fault.at_phase(fault_phase)
        for r, request in posted:
            while not request.test()[0]:
                if not running(self.pids[0]):
                    raise RingBroken("the coordinator ended")
                if not running(self.pids[r]) and not request.test()[0]:
                    self.orphans.append(([request], (obj,)))
                    break
                time.sleep(LOOK_S)


class Member:
    """One member's training: ``step(clock, summed, n)`` applies a clock's sum over ``n``
    members; :meth:`run` goes over ``clocks`` clocks and returns once the coordinator ends the
    run (after sending it this member's final parameters)."""

    def __init__(self, ring: Ring, clocks: int, gradient, step, params: np.ndarray) -> None:
        self.ring, self.clocks, self.gradient, self.step = ring, clocks, gradient, step
        self.params = params
        self.last = None   # (clock, sum, members) of the last clock summed

    def run(self) -> None:
        clock = 0
        while clock < self.clocks:
            try:
                summed = self.ring.sum(self.gradient(clock), clock)
            except Lost:
                clock = self._recover(clock)
                continue
            self._apply(clock, summed, list(self.ring.members))
            clock += 1
        self.ring.comm.send(self.params, dest=0, tag=DONE)
        while (decision := self.ring.recv(0, MPI.ANY_TAG)) is not None:   # else the end
            self._follow(decision)   # a death among those still summing: it may owe a result

    def _apply(self, clock: int, summed: np.ndarray, members: list) -> None:
        self.step(clock, summed, len(members))
        self.last = (clock, summed, members)

    def _recover(self, clock: int) -> int:
        """Report ``clock`` to the coordinator and follow its decision; the clock to go on at.
        Reported again when the member whose sum was due ends before it came (a second death
        during the recovery from the first)."""
        ring, comm = self.ring, self.ring.comm
        while True:
            comm.send(clock, dest=0, tag=REPORT)
            if ring.fault is not None:
                ring.fault.at_phase("reporting a loss")
            try:
                return self._follow(ring.recv(0, DECIDE))
            except Lost:
                continue

    def _follow(self, decision: tuple) -> int:
        """Take the coordinator's decision ``(epoch, members, low, source, behind)``: the new
        ring; where member ``source`` finished clock ``low``, it sends its sum to those
        ``behind``, else clock ``low`` is redone; the clock to go on at. :class:`Lost` when
        this member is behind and ``source`` ends before its sum came."""
        ring = self.ring
        ring.epoch, ring.members, low, source, behind = decision
        if not source:
            return low
        if source == ring.rank:
            ring.give(self.last[1:], behind, "sending a finished sum")
        elif ring.rank in behind:
            summed, members = ring.take(source, RESULT)
            self._apply(low, summed, members)
        return low + 1
