"""The adaptive staleness bound of ``--staleness auto``: a server sets s online within [1, s_max].

After DSSP (Zhao et al. 2019), which lets a fast worker run up to r_max
clocks past the bound when the push times it has seen predict that the
slowest worker's push is near.  Here the decision is taken once per window of
pulls, for every worker alike: when the workers spent more than ``HELD_MAX``
of the window's time held, s grows by the longest hold measured in the
fastest worker's step times (the clocks it could have computed instead of
waiting; its own waits excluded), so one window covers a pause.  s shrinks
by one only at the end of ``QUIET`` windows in a row that could do with less:
no pull needed the bound's top clock, or the step times stayed even
throughout (a lag left from the past, which no wait of the future needs).
So a bound that absorbs intermittent pauses is kept through the quiet
stretches between them, and even workers bring it down to the floor, s = 1:
at s = 0 every worker would wait at every clock for the slowest push of the
last, on any jitter, and still step once per push.
"""
from __future__ import annotations

import math

import numpy as np

HELD_MAX = 1 / 8      # a larger share of the window's time held grows the bound
EVEN = 1.5            # step times within this ratio are even
EWMA = 0.2            # weight of the newest step in a worker's step time
DEFAULT_START = 2     # the bound before the first window closes
QUIET = 3             # windows in a row that could do with less, before the bound shrinks
FLOOR = 1             # the smallest bound auto sets (``--overlap``'s pulls need s >= 1 too)


class AdaptiveBound:
    """The bound in force on one server shard, and what it is set from.

    Parameters
    ----------
    n_workers : int
    s_max : int
        The largest bound (``--staleness-max``).
    floor : int
        The smallest (default ``FLOOR``).
    window : int, optional
        Pulls per decision (default ``max(16, 4 * n_workers)``).

    Attributes
    ----------
    bound : int
        The bound in force: a pull for clock c is answered once the shard's
        version v >= c - bound.
    history : list of (int, int)
        ``(version, bound)`` at the start and at every change.
    """

    def __init__(self, n_workers: int, s_max: int, floor: int = FLOOR,
                 window: int | None = None) -> None:
        if not 0 <= floor <= s_max:
            raise ValueError(f"adaptive bound: need 0 <= floor <= s_max, got {floor}, {s_max}")
        self.s_max, self.floor = int(s_max), int(floor)
        self.window = window or max(16, 4 * n_workers)
        self.bound = min(max(DEFAULT_START, self.floor), self.s_max)
        self.history: list[tuple[int, int]] = [(0, self.bound)]
        self.step_s = np.full(n_workers, math.nan)     # EWMA of a step without its waits
        self._last_push = np.full(n_workers, math.nan)
        self._held_since_push = np.zeros(n_workers)
        self.n_workers = n_workers
        self._needs: list[int] = []
        self._holds: list[float] = []
        self._since = math.nan
        self._uneven = False   # step times were uneven at some push of the window
        self._quiet = 0        # windows in a row that could do with a smaller bound

    def pulled(self, clock: int, version: int, now: float) -> int:
        """A pull for ``clock`` arrived at ``now`` with the shard at ``version``; the bound in force.

        The bound may change here (and only here), before the pull is weighed.
        """
        if not self._needs:
            self._since = now
        self._needs.append(int(clock) - int(version))
        if len(self._needs) >= self.window:
            self._decide(version, now)
        return self.bound

    def answered(self, worker: int, held_s: float) -> None:
        """Worker ``worker``'s pull was answered after the server held it ``held_s`` seconds."""
        self._held_since_push[worker] += held_s
        if held_s > 0:
            self._holds.append(held_s)

    def pushed(self, worker: int, now: float) -> None:
        """Worker ``worker`` pushed at ``now`` (seconds, any fixed origin)."""
        last = self._last_push[worker]
        if math.isfinite(last):
            busy = max(now - last - self._held_since_push[worker], 0.0)
            old = self.step_s[worker]
            self.step_s[worker] = busy if math.isnan(old) else (1 - EWMA) * old + EWMA * busy
        self._last_push[worker] = now
        self._held_since_push[worker] = 0.0
        self._uneven = self._uneven or not self._even()

    def _even(self) -> bool:
        known = self.step_s[np.isfinite(self.step_s) & (self.step_s > 0)]
        return known.size == self.n_workers and known.max() < EVEN * known.min()

    def _decide(self, version: int, now: float) -> None:
        held = sum(self._holds) / max(self.n_workers * (now - self._since), 1e-9)
        known = self.step_s[np.isfinite(self.step_s) & (self.step_s > 0)]
        if held > HELD_MAX:       # grow so that the longest hold would have been computed
            clocks = max(self._holds) / known.min() if self._holds and known.size else 1.0
            new = self.bound + max(1, math.ceil(round(clocks, 1)))
            self._quiet = 0
        else:
            could_shrink = max(self._needs) < self.bound or not self._uneven
            self._quiet = self._quiet + 1 if could_shrink else 0
            new = self.bound - 1 if self._quiet >= QUIET else self.bound
        new = min(max(new, self.floor), self.s_max)
        if new != self.bound:
            self.bound = new
            self.history.append((int(version), new))
        self._needs, self._holds, self._uneven = [], [], False
