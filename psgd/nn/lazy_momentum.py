"""Sparse momentum and Nesterov steps, lazily: a row catches up in closed form on the steps it missed.

An untouched coordinate's (parameter p, velocity v) moves linearly at each step s,
``(p, v) <- A_s (p, v)`` with ``A_s = [[1 - lr_s wd, -lr_s mu_s], [wd, mu_s]]`` (heavy ball;
Nesterov: ``[[1 - lr_s wd (1 + mu_s), -lr_s mu_s^2], [wd, mu_s]]``). The prefix products
``Q_t = A_{t-1} ... A_0`` (float64, 2 x 2) give a row last touched at step a its missed steps
as ``Q_t Q_a^-1`` in O(1), before the batch's forward pass (:meth:`LazyMomentum.catch_up_rows`).
``det Q_t`` shrinks like ``mu^t``, so once it falls below :data:`SWEEP_DET` every row is caught
up and the products restart (:attr:`LazyMomentum.needs_sweep`).
"""
from __future__ import annotations

import numpy as np
from numba import njit

SWEEP_DET = 1e-6   # below this det Q_t, Q_a^-1 loses float32 accuracy: catch every row up


@njit(cache=True)
def _missed(q, t, a):
    """``Q_t Q_a^-1`` as (m11, m12, m21, m22)."""
    det = q[a, 0] * q[a, 3] - q[a, 1] * q[a, 2]
    i11, i12, i21, i22 = q[a, 3] / det, -q[a, 1] / det, -q[a, 2] / det, q[a, 0] / det
    return (q[t, 0] * i11 + q[t, 1] * i21, q[t, 0] * i12 + q[t, 1] * i22,
            q[t, 2] * i11 + q[t, 3] * i21, q[t, 2] * i12 + q[t, 3] * i22)


@njit(cache=True)
def momentum_rows_step(w, g, vel, rows, last, q, t, lr, mu, wd, nesterov, delta, scratch):
    """delta[rows] = (w[rows] caught up from ``last[rows]`` and stepped at t) - w[rows].

    ``vel`` (n_rows, k) and ``last`` are updated only when every value is finite; returns
    whether they were. ``scratch``: (>= len(rows), k) float32 for the new velocities.
    """
    k = w.shape[1]
    bad = False
    for m in range(rows.size):
        r = rows[m]
        a = last[r]
        m11, m12, m21, m22 = _missed(q, t, a) if a < t else (1.0, 0.0, 0.0, 1.0)
        for c in range(k):
            p0, v0 = np.float64(w[r, c]), np.float64(vel[r, c])
            p, v = m11 * p0 + m12 * v0, m21 * p0 + m22 * v0
            gp = g[r, c] + wd * p
            v = mu * v + gp
            new = p - lr * (gp + mu * v) if nesterov else p - lr * v
            delta[m, c] = new - p0
            scratch[m, c] = v
            x = delta[m, c] + scratch[m, c]
            bad |= x - x != 0
    if not bad:
        for m in range(rows.size):
            vel[rows[m]] = scratch[m]
            last[rows[m]] = t + 1
    return not bad


@njit(cache=True)
def momentum_catch_up_rows(w, vel, rows, last, q, t, coupled, change):
    """``w[rows]``, ``vel[rows]`` brought from ``last[rows]`` to t in place; ``last[rows] = t``;
    ``change`` (len(rows), k) = the new ``w[rows]`` minus the old. Without weight decay (not
    ``coupled``) the change does not depend on ``w``."""
    k = w.shape[1]
    for m in range(rows.size):
        r = rows[m]
        a = last[r]
        if a >= t:
            change[m] = 0
            continue
        m11, m12, m21, m22 = _missed(q, t, a)
        for c in range(k):
            p0, v0 = np.float64(w[r, c]), np.float64(vel[r, c])
            if coupled:
                p, v = m11 * p0 + m12 * v0, m21 * p0 + m22 * v0
            else:
                p, v = p0 + m12 * v0, m22 * v0
            w[r, c] = p
            change[m, c] = w[r, c] - np.float32(p0)
            vel[r, c] = v
        last[r] = t


@njit(cache=True)
def momentum_catch_up(w, vel, last, q, t, coupled, change):
    """``change`` = every row's missed steps (up to t) applied to ``w``, ``vel`` brought along;
    without weight decay (not ``coupled``) neither depends on ``w``, which is not read.

    Returns (n, rows): the ids of the n rows with a nonzero change, ascending, in ``rows[:n]``.
    """
    n_rows, k = w.shape
    rows_out = np.empty(n_rows, np.int64)
    n = 0
    for r in range(n_rows):
        a = last[r]
        moved = False
        if a < t:
            m11, m12, m21, m22 = _missed(q, t, a)
            for c in range(k):
                v0 = np.float64(vel[r, c])
                if coupled:
                    p0 = np.float64(w[r, c])
                    change[r, c] = (m11 * p0 + m12 * v0) - p0
                    vel[r, c] = m21 * p0 + m22 * v0
                else:
                    change[r, c] = m12 * v0
                    vel[r, c] = m22 * v0
                moved |= change[r, c] != 0
        else:
            change[r] = 0
        if moved:
            rows_out[n] = r
            n += 1
    return n, rows_out


class LazyMomentum:
    """Heavy-ball or Nesterov momentum over the rows of a (n_rows, row_len) matrix, O(touched rows)
    per step; the eager rule is :func:`psgd.kernels.optim.momentum_step`'s.

    Parameters
    ----------
    n_rows, row_len : int
    momentum, weight_decay : float
    nesterov : bool
    velocity : ndarray, float32 (n_rows * row_len,), optional
        The velocity to keep (a :class:`psgd.nn.optim.Momentum`'s, so that its state is saved);
        zeros of its own otherwise. It is current for a row at its last touch, and for every
        row after :meth:`catch_up`.
    """

    def __init__(self, n_rows: int, row_len: int, momentum: float = 0.9, nesterov: bool = False,
                 weight_decay: float = 0.0, velocity: np.ndarray | None = None) -> None:
        if weight_decay < 0:
            raise ValueError(f"weight decay must be >= 0, got {weight_decay}")
        self.n_rows, self.row_len = int(n_rows), int(row_len)
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.weight_decay = float(weight_decay)
        if velocity is None:
            velocity = np.zeros(self.n_rows * self.row_len, np.float32)
        self.velocity = velocity.reshape(self.n_rows, self.row_len)
        self.last = np.zeros(self.n_rows, np.int64)
        self.q = np.zeros((256, 4), np.float64)
        self.q[0] = (1.0, 0.0, 0.0, 1.0)
        self.t = 0   # steps since the products restarted
        self._scratch = np.empty((0, self.row_len), np.float32)

    @property
    def needs_sweep(self) -> bool:
        """Whether :meth:`catch_up` must run before the next step (``det Q_t`` too small)."""
        q = self.q[self.t]
        return abs(q[0] * q[3] - q[1] * q[2]) < SWEEP_DET

    def step(self, w: np.ndarray, g: np.ndarray, rows: np.ndarray, lr: float,
             momentum: float | None = None) -> tuple[np.ndarray, bool]:
        """(change (len(rows), row_len) that step ``t`` makes to ``w[rows]``, finite).

        ``w``, ``g``: (n_rows, row_len) float32; ``rows``: distinct int64 row ids, the only rows
        where ``g`` may be non-zero; ``momentum``: this step's (default the constructor's). A
        non-finite step leaves the rows' state as it was (the step still counts as untouched).
        """
        if self.needs_sweep:
            raise RuntimeError("LazyMomentum.step: catch_up() is due first")
        mu = self.momentum if momentum is None else float(momentum)
        lr, wd = float(lr), self.weight_decay
        delta = np.empty((len(rows), self.row_len), np.float32)
        if len(self._scratch) < len(rows):
            self._scratch = np.empty((2 * len(rows), self.row_len), np.float32)
        finite = momentum_rows_step(w, g, self.velocity, rows, self.last, self.q, self.t, lr, mu, wd,
                                    self.nesterov, delta, self._scratch)
        if self.t + 1 >= len(self.q):
            self.q = np.concatenate([self.q, np.zeros_like(self.q)])
        a11 = 1.0 - lr * wd * (1.0 + mu) if self.nesterov else 1.0 - lr * wd
        a12 = -lr * mu * mu if self.nesterov else -lr * mu
        p11, p12, p21, p22 = self.q[self.t]
        self.q[self.t + 1] = (a11 * p11 + a12 * p21, a11 * p12 + a12 * p22,
                              wd * p11 + mu * p21, wd * p12 + mu * p22)
        self.t += 1
        return delta, finite

    def catch_up_rows(self, w: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Bring ``w[rows]`` (in place) and their velocity to the present, before a batch's forward
        pass reads them; returns the change (len(rows), row_len) made to ``w[rows]``."""
        change = np.empty((len(rows), self.row_len), np.float32)
        momentum_catch_up_rows(w, self.velocity, rows, self.last, self.q, self.t,
                               self.weight_decay != 0, change)
        return change

    def catch_up(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(change (n_rows, row_len) that brings every row of ``w`` to the present, the sorted ids of
        the rows it moves); the velocity is brought along and the products restart. Without
        weight decay ``w`` is not read."""
        change = np.empty((self.n_rows, self.row_len), np.float32)
        n, rows = momentum_catch_up(w, self.velocity, self.last, self.q, self.t,
                                    self.weight_decay != 0, change)
        self.last[:] = 0
        self.q[0] = (1.0, 0.0, 0.0, 1.0)
        self.t = 0
        return change, rows[:n]
