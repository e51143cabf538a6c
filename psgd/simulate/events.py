"""The event loop: W workers and S server shards under bsp, ssp, asp or hogwild, on a heap of events.

A worker computes a step (its drawn time), pushes its gradient to every shard
over the links (:mod:`psgd.simulate.links`), and posts the pull of its next
clock behind the push, as :class:`psgd.ps.worker.PSWorker` does. A server
takes pushes in arrival order, one at a time for ``push_s`` seconds (a
``summed`` protocol adds them and steps once per clock, ``advance_s``), then
answers every held pull its bound lets through, as :mod:`psgd.ps.server`
does: a pull for clock c waits until the shard's version (the fewest pushes
of any unfinished worker) is at least c - bound. A ``lockfree`` protocol
(hogwild) has no server loop: an update lands and the read returns at once,
and its staleness counts updates. Each shard's order of pushes, replies and
dones is written down as :mod:`psgd.ps.order` records a real server's. With
``cores`` the ranks' CPU work shares that many cores (:mod:`psgd.simulate.cores`):
each shard then takes its messages one at a time, its work stretched as the
workers' computes are. With ``polls`` a rank sees a message at its wait's next
poll (:mod:`psgd.simulate.polls`): a worker's wait begins when it pushes, a
shard's when it has finished its last work.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from psgd.ps.order import DONE, PUSHED, REPLIED
from psgd.simulate.cores import Cores
from psgd.simulate.links import Links

COMPUTED, PUSH, APPLIED, REPLY, DONE_IN, WAKE, WORKED, ADVANCED = range(8)


@dataclass(frozen=True)
class Rules:
    """What the protocol's servers do: ``bound`` (inf: never hold a pull), ``summed`` (one
    step per clock on the sum of its pushes), ``lockfree`` (no server loop; staleness counts
    updates); seconds per push and per step of a shard; bytes per shard of a push and a pull."""

    bound: float
    summed: bool = False
    lockfree: bool = False
    push_s: float = 0.0
    advance_s: float = 0.0
    push_bytes: float = 0.0
    pull_bytes: float = 0.0


@dataclass
class Schedule:
    """What a simulation found. ``order``: int32 (n, 4) shard, kind, worker, clock of every
    server event in time order (``times`` float64 (n,) when); histograms of staleness (clocks,
    or updates when lock-free) and delay (updates between read and push), summed over shards."""

    order: np.ndarray
    times: np.ndarray
    staleness: np.ndarray
    delay: np.ndarray
    seconds: float
    updates: int
    worker_busy_s: np.ndarray
    server_busy_s: np.ndarray
    link_utilisation: float


class _Shard:
    def __init__(self, workers: int, steps: int) -> None:
        self.free = 0.0
        self.busy = 0.0
        self.version = 0
        self.updates = 0
        self.pushes = [0] * workers
        self.level = [0] * (steps + 2)   # unfinished workers by pushes made
        self.level[0] = workers
        self.pending: list[tuple[int, int]] = []   # held pulls (worker, clock), arrival order
        self.active = workers
        self.inbox: deque = deque()   # with cores: (kind, worker) not yet taken up
        self.working = False


class _Loop:
    def __init__(self, rules: Rules, times: np.ndarray, servers: int, links: Links,
                 waits: np.ndarray, cores: tuple | None, polls=None) -> None:
        self.rules, self.times, self.S, self.links = rules, times, servers, links
        self.waits, self.polls = waits, polls
        self.W, self.T = times.shape
        self.heap: list = []
        self.seq = 0
        self.shards = [_Shard(self.W, self.T) for _ in range(servers)]
        self.read_version = np.zeros((self.W, servers), np.int64)
        self.read_updates = np.zeros((self.W, servers), np.int64)
        self.waiting = [servers] * self.W    # replies a worker still needs for its next clock
        self.clock = [0] * self.W            # the clock a worker computes next
        self.wait_from = [0.0] * self.W      # when a worker's wait for its pull began
        self.busy = np.zeros(self.W)
        self.order: list[tuple] = []
        self.stale: list[int] = []
        self.delay: list[int] = []
        self.cores = None if cores is None else Cores(
            cores[0], self.W + (0 if rules.lockfree else servers), cores[1],
            lambda t, g: self.at(t, WAKE, g))

    def at(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def run(self) -> float:
        for s in range(self.S):
            self.shards[s].pending = [(w, 0) for w in range(self.W)]
            self._answer(s, self.links.latency())
        t = 0.0
        handlers = (self._computed, self._push, self._applied, self._got_reply, self._done,
                    self._wake, self._worked, self._advanced)
        self.handlers = handlers
        while self.heap:
            t, _, kind, a, b = heapq.heappop(self.heap)
            handlers[kind](t, a, b)
        return t

    def _computed(self, t: float, w: int, _b: int) -> None:
        self.wait_from[w] = t
        for s in range(self.S):
            self.at(self.links.send(self.S + w, s, self.rules.push_bytes, t), PUSH, s, w)

    def _push(self, t: float, s: int, w: int) -> None:
        shard = self.shards[s]
        if self.rules.lockfree:
            self._applied(t, s, w)
            return
        if self.cores:
            shard.inbox.append((PUSH, w))
            self._serve(t, s)
            return
        if self.polls and t > shard.free:   # idle since its last work: seen at its next poll
            t = self.polls.seen(shard.free, t)
        shard.free = max(t, shard.free) + self.rules.push_s
        shard.busy += self.rules.push_s
        self.at(shard.free, APPLIED, s, w)

    def _applied(self, t: float, s: int, w: int) -> None:
        shard, rules = self.shards[s], self.rules
        c = shard.pushes[w]
        delay = shard.updates - int(self.read_updates[w, s])
        self.stale.append(delay if rules.lockfree else c - int(self.read_version[w, s]))
        self.delay.append(delay)
        self.order.append((t, s, PUSHED, w, c))
        if not rules.summed:
            shard.updates += 1
        shard.pushes[w] = c + 1
        shard.level[c] -= 1
        shard.level[c + 1] += 1
        shard.pending.append((w, c + 1))   # the pull posted behind the push
        shard.working = False
        self._advance(t, s)
        if self.cores:
            self._serve(t, s)

    def _advance(self, t: float, s: int) -> None:
        shard = self.shards[s]
        old = shard.version
        if shard.active:
            while shard.level[shard.version] == 0:
                shard.version += 1
        if shard.version > old and self.rules.summed:
            shard.updates += 1
            if self.cores:   # the step is CPU work too: the replies go out after it
                shard.working = True
                shard.busy += self.rules.advance_s
                self.cores.start(t, self.rules.advance_s, ADVANCED, s)
                return
            shard.free = max(t, shard.free) + self.rules.advance_s
            shard.busy += self.rules.advance_s
            t = shard.free
        if shard.version > old:
            self._answer(s, t)
        elif shard.pending and shard.pending[-1][1] <= shard.version + self.rules.bound:
            self._reply(s, *shard.pending.pop(), t)   # the new pull only: the rest still wait

    def _answer(self, s: int, t: float) -> None:
        """Every held pull the bound lets through, in arrival order."""
        shard = self.shards[s]
        limit = shard.version + self.rules.bound
        keep = []
        for w, c in shard.pending:
            if c <= limit:
                self._reply(s, w, c, t)
            else:
                keep.append((w, c))
        shard.pending = keep

    def _reply(self, s: int, w: int, c: int, t: float) -> None:
        shard = self.shards[s]
        self.order.append((t, s, REPLIED, w, c))
        self.read_version[w, s] = shard.version
        self.read_updates[w, s] = shard.updates
        landed = self.links.send(s, self.S + w, self.rules.pull_bytes, t)
        if self.polls:
            landed = self.polls.seen(self.wait_from[w], landed)
        self.at(landed, REPLY, w, s)

    def _got_reply(self, t: float, w: int, _s: int) -> None:
        self.waiting[w] -= 1
        if self.waiting[w]:
            return
        self.waiting[w] = self.S
        c = self.clock[w]
        if c == self.T:   # the pull after the last step: done
            for s in range(self.S):
                self.at(t + self.links.latency(), DONE_IN, s, w)
            return
        self.clock[w] = c + 1
        self.busy[w] += self.times[w, c]
        if self.cores:   # the CPU part shares the cores, then the wait off them
            self.cores.start(t, self.times[w, c] - self.waits[w, c], WORKED, w, c)
        else:
            self.at(t + self.times[w, c], COMPUTED, w)

    def _done(self, t: float, s: int, w: int) -> None:
        if self.cores:
            self.shards[s].inbox.append((DONE_IN, w))
            self._serve(t, s)
            return
        self._finish(max(t, self.shards[s].free), s, w)

    def _wake(self, t: float, generation: int, _b: int) -> None:
        for kind, a, b in self.cores.wake(t, generation):
            self.handlers[kind](t, a, b)

    def _worked(self, t: float, w: int, c: int) -> None:
        if self.waits[w, c] > 0:
            self.at(t + self.waits[w, c], COMPUTED, w)
        else:
            self._computed(t, w, 0)

    def _advanced(self, t: float, s: int, _b: int) -> None:
        self.shards[s].working = False
        self._answer(s, t)
        self._serve(t, s)

    def _serve(self, t: float, s: int) -> None:
        """With cores: a shard idle takes up its next message (a push: CPU work; a done)."""
        shard = self.shards[s]
        while not shard.working and shard.inbox:
            kind, w = shard.inbox.popleft()
            if kind == DONE_IN:
                self._finish(t, s, w)
            else:
                shard.working = True
                shard.busy += self.rules.push_s
                self.cores.start(t, self.rules.push_s, APPLIED, s, w)

    def _finish(self, t: float, s: int, w: int) -> None:
        shard = self.shards[s]
        self.order.append((t, s, DONE, w, -1))
        shard.level[shard.pushes[w]] -= 1
        shard.active -= 1
        self._advance(t, s)


def simulate(rules: Rules, times: np.ndarray, servers: int, links: Links,
             waits: np.ndarray | None = None, cores: tuple | None = None,
             polls=None) -> Schedule:
    """Run the job to its end: every worker computes ``times.shape[1]`` steps.

    Parameters
    ----------
    rules : Rules
    times : float64 (W, T)
        Seconds of each worker's compute at each clock (:func:`psgd.simulate.compute.compute_times`).
    servers : int
        S >= 1 shards.
    links : Links
        The network, with ranks 0..S-1 the servers and S.. the workers.
    waits : float64 (W, T), optional
        The part of each compute spent off the cores (a straggler's sleep; default none).
    cores : (int, bool), optional
        The cores the ranks share and whether a waiting rank is runnable
        (:class:`psgd.simulate.cores.Cores`); default a core per rank.
    polls : psgd.simulate.polls.Polls, optional
        The waits' polls: a message is seen at the receiver's next poll (default: on landing).
        Not with ``cores``.
    """
    times = np.asarray(times, np.float64)
    waits = np.zeros_like(times) if waits is None else np.asarray(waits, np.float64)
    loop = _Loop(rules, times, servers, links, waits, cores, polls)
    seconds = loop.run()
    order = loop.order
    return Schedule(
        order=np.array([e[1:] for e in order], np.int32).reshape(-1, 4),
        times=np.array([e[0] for e in order], np.float64),
        staleness=np.bincount(np.asarray(loop.stale, np.int64), minlength=1),
        delay=np.bincount(np.asarray(loop.delay, np.int64), minlength=1),
        seconds=seconds, updates=loop.W * loop.T, worker_busy_s=loop.busy,
        server_busy_s=np.array([sh.busy for sh in loop.shards]),
        link_utilisation=links.utilisation(seconds))
