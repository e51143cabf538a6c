"""Sparse SGD steps with weight decay applied lazily: a row catches up on the decay it missed when read.

Eager SGD with decay ``lam`` scales every row by ``1 - lr_t * lam`` at every step t,
touched or not. Lazily, row r remembers the step ``last[r]`` up to which it is decayed;
when step t's batch reads it, before the forward pass, it is scaled by
``prod_{s = last[r]}^{t-1} (1 - lr_s * lam)`` (kept as a running sum of logs, so any
learning-rate schedule is caught up; :func:`decay_rows`), so the gradient is taken
where eager SGD takes it; then step t is taken eagerly. :meth:`catch_up` brings every row
to the present.

Bit for bit, this is the eager rule that scales a row by that closed form from the value it
had after its last step (:func:`decay_factor`, one rounding), not by ``1 - lr_s * lam`` once
per step (one rounding per step, which no O(1) catch-up reproduces); the two agree up to those
roundings. docs/design/hogwild.md states the rule; tests/test_adagrad.py checks both.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def decay_factor(logs, a, t):
    """``prod_{s=a}^{t-1} (1 - lr_s * lam)`` from ``logs[t] = sum_{s<t} log(1 - lr_s * lam)``
    (float64; 1.0 when ``a == t``): the one factor every decay of a row goes through."""
    return 1.0 if a == t else np.exp(logs[t] - logs[a])


@njit(cache=True)
def decay_rows(w, rows, last, logs, t, change):
    """``w[rows]`` scaled in place by the decay they missed from ``last[rows]`` to step t;
    ``last[rows] = t``; ``change`` (>= len(rows), k) = the new ``w[rows]`` minus the old."""
    k = w.shape[1]
    for m in range(rows.size):
        r = rows[m]
        factor = decay_factor(logs, last[r], t)
        for c in range(k):
            old = w[r, c]
            w[r, c] = factor * old
            change[m, c] = w[r, c] - old
        last[r] = t


@njit(cache=True)
def sparse_step(w, g, rows, last, logs, t, lr, lam, delta, in_place=False):
    """delta[rows] = (w[rows] caught up and stepped at t) - w[rows]; ``last[rows] = t + 1``
    (rows already brought to t by :func:`decay_rows` are only stepped); with ``in_place``
    the stepped values are also written to ``w[rows]``.

    Returns whether every value of ``delta`` is finite.
    """
    k = w.shape[1]
    keep = 1.0 - lr * lam
    bad = False
    for m in range(rows.size):
        r = rows[m]
        factor = decay_factor(logs, last[r], t) * keep if lam != 0.0 else 1.0
        for c in range(k):
            new = factor * w[r, c] - lr * g[r, c]
            delta[m, c] = new - w[r, c]
            x = delta[m, c]
            bad |= x - x != 0
            if in_place:
                w[r, c] = new
        last[r] = t + 1
    return not bad


class LazyDecaySGD:
    """Plain SGD over the rows of a (n_rows, row_len) matrix, O(touched rows) per step.

    Parameters
    ----------
    n_rows, row_len : int
    weight_decay : float
    """

    def __init__(self, n_rows: int, row_len: int, weight_decay: float = 0.0) -> None:
        if weight_decay < 0:
            raise ValueError(f"weight decay must be >= 0, got {weight_decay}")
        self.n_rows, self.row_len, self.weight_decay = int(n_rows), int(row_len), float(weight_decay)
        self.t = 0
        self.logs = np.zeros(1024, np.float64)     # logs[t] = sum_{s < t} log(1 - lr_s * lam)
        self.last = np.zeros(self.n_rows, np.int64)

    def reserve(self, steps: int, max_lr: float) -> None:
        """Check and make room for ``steps`` more steps at learning rates up to ``max_lr``
        (for code that takes them itself, with :func:`sparse_step` and :attr:`logs`)."""
        if max_lr * self.weight_decay >= 1:
            raise ValueError(f"lr * weight_decay must be < 1 for a decay factor, got "
                             f"{max_lr * self.weight_decay}")
        if self.t + steps + 1 >= len(self.logs):
            self.logs = np.concatenate([self.logs, np.zeros(max(len(self.logs), steps + 1))])

    def step(self, w: np.ndarray, g: np.ndarray, rows: np.ndarray, lr: float,
             in_place: bool = False) -> np.ndarray:
        """The change (len(rows), row_len) that step ``t`` makes to ``w[rows]`` (written there too
        only with ``in_place``).

        ``w``, ``g``: (n_rows, row_len); ``rows``: distinct int64 row ids, the only rows where
        ``g`` may be non-zero.
        """
        lam = self.weight_decay
        self.reserve(1, lr)
        delta = np.empty((len(rows), self.row_len), w.dtype)
        sparse_step(w, g, rows, self.last, self.logs, self.t, float(lr), lam, delta, in_place)
        self.logs[self.t + 1] = self.logs[self.t] + np.log1p(-lr * lam)
        self.t += 1
        return delta

    def step_in_place(self, w: np.ndarray, g: np.ndarray, rows: np.ndarray, lr: float) -> bool:
        """:meth:`step` written into ``w[rows]`` (each value rounded once); whether it was finite."""
        delta = self.step(w, g, rows, lr, in_place=True)
        return bool(np.isfinite(delta).all())

    def catch_up_rows(self, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Bring ``w[rows]`` (in place) to the present decay, before a batch's forward pass reads
        them; returns the change (len(rows), row_len) made to ``w[rows]``."""
        change = np.empty((len(rows), self.row_len), w.dtype)
        decay_rows(w, rows, self.last, self.logs, self.t, change)
        return change

    def catch_up(self, w: np.ndarray) -> np.ndarray:
        """The change (n_rows, row_len) that brings every row of ``w`` to the present decay
        (``w`` itself is not written; :meth:`catch_up_rows` over every row writes it)."""
        return self.catch_up_rows(w.copy(), np.arange(self.n_rows, dtype=np.int64))
