"""Hot rows of sparse hogwild: the rows most batches touch, whose changes a worker holds.

Every batch of a Zipf-like sparse set touches the bias row and the most frequent features, so
with plain hogwild every step of every worker writes the same cache lines. A worker holds its
changes to those rows for ``hold`` steps (``--hold-hot``) and then adds them at once and reads
the rows back (:func:`settle`); in between it steps on its own copy of them. No change is lost;
those rows' updates reach the other workers up to ``hold`` steps late.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from psgd.hogwild.rows import add_row, copy_row
from psgd.kernels.atomic import atomic_add

HOT_TOUCH = 0.5   # a row is hot when a batch touches it more often than not


def hot_rows(indices: np.ndarray, n_samples: int, n_rows: int, batch: int,
             hold: int, touch: float = HOT_TOUCH) -> tuple[np.ndarray, np.ndarray]:
    """(slot, hot): the int64 rows (features, then the bias row ``n_rows - 1``) that a batch of
    ``batch`` samples from a CSR slice of ``n_samples`` rows with column ``indices`` touches with
    probability above ``touch``, and ``slot[r]``, r's place among them (-1: not hot).
    None are hot when ``hold`` <= 1."""
    slot = np.full(n_rows, -1, np.int64)
    if hold <= 1 or batch < 1:
        return slot, np.zeros(0, np.int64)
    per_sample = np.bincount(indices, minlength=n_rows - 1)[:n_rows - 1] / max(n_samples, 1)
    touched = 1.0 - (1.0 - np.minimum(per_sample, 1.0)) ** batch
    hot = np.append(np.flatnonzero(touched > touch), n_rows - 1).astype(np.int64)
    slot[hot] = np.arange(hot.size)
    return slot, hot


@njit(cache=True)
def read_rows(params, shards, bounds, touched, k, slot):
    """``params`` at the ``touched`` rows = the shared ``shards``' values, but for held rows
    (``slot[r] >= 0``), whose values are the worker's own until :func:`settle`; rows read."""
    n = 0
    for r in touched:
        if slot[r] < 0:
            copy_row(params, shards, bounds, r, k)
            n += 1
    return n


@njit(cache=True)
def read_held(params, shards, bounds, hot, k):
    """``params`` at the ``hot`` rows = the shared ``shards``' values (a run's start); rows read."""
    for r in hot:
        copy_row(params, shards, bounds, r, k)
    return hot.size


@njit(cache=True)
def add_or_hold(shards, bounds, touched, k, values, slot, held):
    """Atomically add ``values`` (the ``touched`` rows', flat) into the ``shards``, but a held
    row's into ``held[slot[r]]``; rows added."""
    n = 0
    for m in range(touched.size):
        h = slot[touched[m]]
        if h < 0:
            add_row(shards, bounds, touched[m], k, values, m * k)
            n += 1
        else:
            for c in range(k):
                held[h, c] += values[m * k + c]
    return n


@njit(cache=True)
def step_held(w, touched, slot, change):
    """Apply the step's ``change`` to the held rows of ``w``, which are not read back."""
    for m in range(touched.size):
        r = touched[m]
        if slot[r] >= 0:
            for c in range(w.shape[1]):
                w[r, c] += change[m, c]


@njit(cache=True)
def settle(shards, bounds, hot, k, held, params, count, staleness, first, end, base):
    """Add the held rows' changes into the ``shards`` and read the rows back (the other
    workers' changes with them); add the updates of steps ``first..end-1`` (those with
    ``staleness >= 0``) to the shared ``count`` at once, each step's staleness being the other
    workers' updates since ``base``, the count after this worker's last settle. Returns the
    count after this one."""
    flat = held.ravel()
    for h in range(hot.size):
        add_row(shards, bounds, hot[h], k, flat, h * k)
    held[:] = 0
    for h in range(hot.size):
        copy_row(params, shards, bounds, hot[h], k)
    own = 0
    for i in range(first, end):
        own += staleness[i] >= 0
    before = atomic_add(count, 0, np.int64(own))
    for i in range(first, end):
        if staleness[i] >= 0:
            staleness[i] = before - base
    return before + own
