"""Sparse AdaGrad steps: only the touched rows' accumulators and parameters change.

Without weight decay an eager AdaGrad step leaves a coordinate with a zero gradient exactly
as it was (``acc + 0``, ``p - lr * 0 / (sqrt(acc) + eps)``), so stepping only the rows a batch
touches, with the arithmetic of :func:`psgd.kernels.optim.adagrad_step`, is the eager step:
there is nothing to catch up on. (Weight decay would move every row at every step, by an
amount that depends on its accumulator: no closed form, so it is refused on sparse steps.)
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy")
def adagrad_rows_step(w, g, acc, rows, lr, eps, delta, scratch, in_place):
    """``delta[m] = (w[rows[m]] stepped) - w[rows[m]]``; with ``in_place`` the stepped values are
    written to ``w[rows]``. ``acc[rows]`` (and ``w[rows]``) change only when every value is
    finite; returns whether they were. ``scratch``: (2, >= len(rows), k) float32."""
    k = w.shape[1]
    lr32, eps32 = np.float32(lr), np.float32(eps)
    bad = False
    for m in range(rows.size):
        r = rows[m]
        for c in range(k):
            gi = g[r, c]
            p = w[r, c]
            a = acc[r, c] + gi * gi
            new = p - lr32 * gi / (np.sqrt(a) + eps32)
            scratch[0, m, c] = a
            scratch[1, m, c] = new
            delta[m, c] = new - p
            x = new + a
            bad |= x - x != 0
    if bad:
        return False
    for m in range(rows.size):
        r = rows[m]
        for c in range(k):
            acc[r, c] = scratch[0, m, c]
            if in_place:
                w[r, c] = scratch[1, m, c]
    return True


class LazyAdagrad:
    """AdaGrad over the rows of a (n_rows, row_len) matrix, O(touched rows) per step; the eager
    rule is :func:`psgd.kernels.optim.adagrad_step`'s without weight decay.

    Parameters
    ----------
    n_rows, row_len : int
    eps : float
    acc : ndarray, float32 (n_rows * row_len,)
        The accumulator to keep (a :class:`psgd.nn.optim.Adagrad`'s, so its state is saved).
    """

    def __init__(self, n_rows: int, row_len: int, eps: float, acc: np.ndarray) -> None:
        self.n_rows, self.row_len, self.eps = int(n_rows), int(row_len), float(eps)
        self.acc = acc.reshape(self.n_rows, self.row_len)
        self.weight_decay = 0.0
        # LazyDecaySGD's state as psgd.hogwild.fused reads it: no row ever misses a step
        self.last, self.logs, self.t = np.zeros(self.n_rows, np.int64), np.zeros(1), 0
        self._scratch = np.empty((2, 0, self.row_len), np.float32)

    def reserve(self, steps: int, max_lr: float) -> None:
        """Nothing to make room for (as :meth:`psgd.nn.lazy_decay.LazyDecaySGD.reserve`)."""

    def _run(self, w, g, rows, lr, in_place):
        if self._scratch.shape[1] < len(rows):
            self._scratch = np.empty((2, 2 * len(rows), self.row_len), np.float32)
        delta = np.empty((len(rows), self.row_len), np.float32)
        finite = adagrad_rows_step(w, g, self.acc, rows, float(lr), self.eps, delta,
                                   self._scratch, in_place)
        return delta, finite

    def step(self, w: np.ndarray, g: np.ndarray, rows: np.ndarray, lr: float) -> tuple[np.ndarray, bool]:
        """(change (len(rows), row_len) that the step makes to ``w[rows]``, not applied; finite).

        ``w``, ``g``: (n_rows, row_len) float32; ``rows``: distinct int64 row ids, the only rows
        where ``g`` may be non-zero. A non-finite step leaves the accumulator as it was.
        """
        return self._run(w, g, rows, lr, False)

    def step_in_place(self, w: np.ndarray, g: np.ndarray, rows: np.ndarray, lr: float) -> bool:
        """The step written into ``w[rows]``; whether it was finite (if not, ``w`` and the
        accumulator are left as they were)."""
        return self._run(w, g, rows, lr, True)[1]
