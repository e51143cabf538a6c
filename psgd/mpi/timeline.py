"""Per-rank spans for ``--timeline``: what this process did when, kept in fixed arrays.

Off unless :func:`start` was called: every site checks ``timeline.current is
not None``, one attribute read. On, a span is five numbers in preallocated
arrays; at most :data:`MAX_SPANS` are kept per rank (the first ones), later
ones are only counted. Times are seconds since this rank's zero, which
:func:`start` takes right after a barrier, so ranks line up to within the
barrier's exit skew, also across nodes.
"""
from __future__ import annotations

import time

import numpy as np

MAX_SPANS = 50_000
IDLE_MIN_S = 2e-5   # a server's idle gaps shorter than this are not spans of their own
# span kinds; row 0 is a rank's loop (its spans tile its wall time), row 1 the protocol's detail
KINDS = ("start", "data", "compute", "straggle", "step", "lead", "finish", "push", "wait", "pull", "allreduce", "optimizer",
         "apply", "reply", "snapshot", "idle", "forward", "backward", "send", "recv", "collective")
ROW = {"push": 1, "wait": 1, "pull": 1, "allreduce": 1, "optimizer": 1, "send": 1, "recv": 1,
       "collective": 1}   # collective: a tensor group's all-reduce, gather, scatter or halo
_CODE = {name: i for i, name in enumerate(KINDS)}


class Timeline:
    """The spans of one rank."""

    def __init__(self, limit: int = MAX_SPANS) -> None:
        self.zero = time.perf_counter()
        self.kind = np.zeros(limit, np.int8)
        self.t = np.zeros((limit, 2), np.float64)
        self.args = np.full((limit, 2), -1, np.int64)   # clock, staleness (-1: none)
        self.n = 0
        self.dropped = 0
        self.wall = 0.0   # the rank's own measure of its training time (s), for comparison

    def span(self, kind: str, t0: float, t1: float, clock: int = -1, staleness: int = -1) -> None:
        """One span from ``t0`` to ``t1`` (``time.perf_counter()`` values)."""
        if self.n == len(self.kind):
            self.dropped += 1
            return
        i = self.n
        self.kind[i] = _CODE[kind]
        self.t[i] = (t0 - self.zero, t1 - self.zero)
        self.args[i] = (clock, staleness)
        self.n += 1

    def packed(self) -> np.ndarray:
        """float64 (n + 1, 5): a row [n, dropped, wall, 0, 0], then kind, t0, t1, clock, staleness."""
        out = np.zeros((self.n + 1, 5), np.float64)
        out[0, :3] = (self.n, self.dropped, self.wall)
        out[1:, 0] = self.kind[:self.n]
        out[1:, 1:3] = self.t[:self.n]
        out[1:, 3:] = self.args[:self.n]
        return out


current: Timeline | None = None


def start(limit: int = MAX_SPANS) -> Timeline:
    """Begin recording this rank's spans (call right after a barrier)."""
    global current
    current = Timeline(limit)
    return current


def stop() -> Timeline | None:
    """End recording; returns what was recorded."""
    global current
    done, current = current, None
    return done
