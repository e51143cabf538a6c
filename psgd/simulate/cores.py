"""Ranks sharing fewer cores than there are of them: processor sharing of their CPU work.

With ``--cores C``, a worker's compute and a server's work on a push are jobs
on C cores: while n jobs are runnable each progresses at min(1, C/n) seconds of
work per second, so a compute stretches when more ranks run than there are
cores. A waiting rank is not runnable (psgd's waits sleep between polls);
``busy_wait`` counts every rank as runnable all the time, as MPICH's own
blocking calls spin. All jobs progress alike, so the pool keeps one clock of
work done per job and a heap of each job's finish on that clock.
"""
from __future__ import annotations

import heapq
from typing import Callable


class Cores:
    """C cores shared by the jobs started on them; ``at(t, generation)`` asks the event loop
    to call :meth:`wake` at ``t`` (a wake of an older generation is stale: ignore it)."""

    def __init__(self, cores: int, ranks: int, busy_wait: bool,
                 at: Callable[[float, int], None]) -> None:
        if cores < 1:
            raise ValueError(f"--cores must be >= 1, got {cores}")
        self.cores, self.floor = cores, ranks if busy_wait else 0
        self.at = at
        self.work = 0.0       # seconds of work each job running since 0 has done
        self.last = 0.0       # when ``work`` was last brought up to date
        self.jobs: list = []  # (work at which it ends, seq, kind, a, b)
        self.seq = 0
        self.generation = 0

    def rate(self) -> float:
        """Seconds of work per second each runnable job gets now."""
        n = max(len(self.jobs), self.floor)
        return min(1.0, self.cores / n) if n else 1.0

    def _sync(self, t: float) -> None:
        self.work += (t - self.last) * self.rate()
        self.last = t

    def start(self, t: float, work: float, kind: int, a: int, b: int = 0) -> None:
        """A job of ``work`` CPU seconds runnable from ``t``; when done the loop handles
        ``(kind, a, b)``."""
        self._sync(t)
        self.seq += 1
        heapq.heappush(self.jobs, (self.work + work, self.seq, kind, a, b))
        self._next()

    def wake(self, t: float, generation: int) -> list:
        """The jobs done by ``t`` as (kind, a, b), in the order they started; [] if stale."""
        if generation != self.generation:
            return []
        self._sync(t)
        done = []
        while self.jobs and self.jobs[0][0] <= self.work * (1 + 1e-12) + 1e-15:
            done.append(heapq.heappop(self.jobs))
        self._next()
        return [job[2:] for job in sorted(done, key=lambda j: j[1])]

    def _next(self) -> None:
        self.generation += 1
        if self.jobs:
            left = max(0.0, self.jobs[0][0] - self.work)
            self.at(self.last + left / self.rate(), self.generation)
