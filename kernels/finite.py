"""NaN/Inf checks over flat float32 vectors in one pass: alone, or fused with an add.

``g - g != 0`` is True exactly for NaN and Inf; OR-ed into a bool it
vectorizes without fast-math (which would let the compiler assume no NaNs).
"""
from __future__ import annotations

from numba import njit


@njit(cache=True)
def finite(grad):
    """True when no value of ``grad`` is NaN or Inf (one pass, no temporary).

    Parameters
    ----------
    grad : ndarray, float32 (n,)

    Returns
    -------
    bool
    """
    bad = False
    for i in range(grad.shape[0]):
        gi = grad[i]
        bad |= gi - gi != 0
    return not bad


@njit(cache=True)
def add_into(total, grad, check_total=False):
    """``grad += total`` in place (so ``grad`` becomes the new sum); True when ``grad`` was finite.

    ``total`` is never written, so a non-finite push leaves the old sum intact.

    Parameters
    ----------
    total, grad : ndarray, float32 (n,)
    check_total : bool
        Check ``total``'s values too (False if either held a NaN or Inf);
        ``finite(total)`` afterwards tells which.

    Returns
    -------
    bool
    """
    bad = False
    for i in range(grad.shape[0]):
        gi = grad[i]
        ti = total[i]
        bad |= gi - gi != 0
        if check_total:
            bad |= ti - ti != 0
        grad[i] = ti + gi
    return not bad
