"""What ranks report at the end of training: staleness histograms and a server's result."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class StalenessHistogram:
    """Counts of updates by staleness 0, 1, 2, ..., growing as larger values arrive."""

    def __init__(self, counts=()) -> None:
        self._counts = np.zeros(16, np.int64)
        self.merge(counts)

    def add(self, staleness: int) -> None:
        """Count one update of ``staleness`` (>= 0) clocks."""
        if staleness >= self._counts.size:
            self._grow(staleness + 1)
        self._counts[staleness] += 1

    def merge(self, counts) -> None:
        """Add another histogram's counts (array-like, index = staleness)."""
        counts = np.asarray(counts, np.int64)
        if counts.size > self._counts.size:
            self._grow(counts.size)
        self._counts[:counts.size] += counts

    def _grow(self, size: int) -> None:
        grown = np.zeros(max(size, 2 * self._counts.size), np.int64)
        grown[:self._counts.size] = self._counts
        self._counts = grown

    @property
    def counts(self) -> np.ndarray:
        """int64 counts up to the largest staleness seen (length >= 1)."""
        nz = np.flatnonzero(self._counts)
        return self._counts[:int(nz[-1]) + 1 if nz.size else 1].copy()


@dataclass
class ServerResult:
    """What one server rank reports when its workers are done.

    Attributes
    ----------
    staleness_hist : ndarray, int64 (max staleness + 1,)
        Number of updates seen at each staleness.
    n_pushes, n_updates, n_skipped : int
        Pushes received, optimizer steps applied, non-finite updates skipped.
    n_window_pushes : int
        Pushes read from a worker's segment of the push window (:mod:`psgd.ps.push_window`).
    n_in_place, n_version_waits : int
        Steps written over the live shard (no pull reply was reading it), and
        steps that first waited for a reply to free a spare version.
    cpu_s, wall_s : float
        Process CPU time and wall time of the server loop.
    params : ndarray, float32 (n,) or None
        Rank 0 only: the final full parameter vector.
    opt_state : dict or None
        Rank 0 only: the full optimizer state (per-element float32 (n,) arrays
        concatenated in shard order; scalars from shard 0), when the servers own it.
    n_snapshots : int
        Snapshots handed to ``on_snapshot`` (rank 0) or sent (other servers).
    compensation : dict or None
        What the staleness compensation did on this shard (:mod:`psgd.ps.compensation`).
    bound_history : list of (int, int) or None
        ``--staleness auto``: ``(version, bound)`` at the start and at every
        change of the bound (:mod:`psgd.ps.adaptive`).
    buffer_bytes : int
        Bytes of the float32 shard-length buffers the server held (parameter
        versions, receive/sum buffers, optimizer state); the same whatever
        the number of workers.
    events : ndarray, int32 (n, 3) or None
        With ``config.recording.record``: the shard's order of events (:mod:`psgd.ps.order`).
    push_bytes : int
        Bytes of every push this shard received (control header and payload, as
        MPI delivered them; a push-window push counts its header and its slice).
    """

    staleness_hist: np.ndarray
    n_pushes: int = 0
    n_updates: int = 0
    n_skipped: int = 0
    n_window_pushes: int = 0
    n_in_place: int = 0
    n_version_waits: int = 0
    cpu_s: float = 0.0
    wall_s: float = 0.0
    params: np.ndarray | None = None
    opt_state: dict | None = None
    n_snapshots: int = 0
    compensation: dict | None = None
    bound_history: list | None = None
    buffer_bytes: int = 0
    events: np.ndarray | None = None
    push_bytes: int = 0

    @property
    def max_staleness(self) -> int:
        nz = np.flatnonzero(self.staleness_hist)
        return int(nz[-1]) if nz.size else 0

    @property
    def mean_staleness(self) -> float:
        total = int(self.staleness_hist.sum())
        weighted = (np.arange(self.staleness_hist.size) * self.staleness_hist).sum()
        return float(weighted / total) if total else 0.0
