"""When a waiting rank sees a message: psgd's waits poll, then sleep with a growing backoff.

A wait of :mod:`psgd.mpi.wait` makes ``SPIN`` bare polls, then sleeps
``MIN_SLEEP``, ``GROWTH`` times longer each time, up to ``max_sleep``; each
sleep overshoots by the timer's slack. A message that lands during a wait is
taken at the first poll after it lands. :func:`measure` reads a poll's and a
sleep's cost on this machine.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Polls:
    """A wait's poll times: ``spin_s`` of bare polls from its start, then sleeps from
    ``min_sleep`` growing by ``growth`` up to ``max_sleep``, each ``slack`` longer than asked."""

    spin_s: float
    min_sleep: float
    growth: float
    max_sleep: float
    slack: float

    def seen(self, start: float, t: float) -> float:
        """The first poll at or after ``t`` of a wait begun at ``start``."""
        poll = start + self.spin_s
        if t <= poll:
            return t
        sleep = self.min_sleep
        while sleep < self.max_sleep:
            poll += sleep + self.slack
            if poll >= t:
                return poll
            sleep = min(sleep * self.growth, self.max_sleep)
        step = self.max_sleep + self.slack
        return poll + np.ceil((t - poll) / step) * step


def measure(max_sleep: float | None = None, samples: int = 20) -> Polls:
    """psgd's wait constants with this machine's cost of a bare poll (an ``Iprobe``) and a
    sleep's slack (median of ``samples`` sleeps of ``MIN_SLEEP``); ``max_sleep``: default the
    waits' setting."""
    from mpi4py import MPI

    from psgd.mpi import wait
    comm = MPI.COMM_SELF
    t0 = time.perf_counter()
    for _ in range(wait.SPIN):
        comm.Iprobe()
    spin_s = time.perf_counter() - t0
    slept = []
    for _ in range(samples):
        t0 = time.perf_counter()
        time.sleep(wait.MIN_SLEEP)
        slept.append(time.perf_counter() - t0 - wait.MIN_SLEEP)
    return Polls(spin_s, wait.MIN_SLEEP, wait.GROWTH,
                 wait.settings.max_sleep if max_sleep is None else max_sleep,
                 max(0.0, float(np.median(slept))))
