"""Optimizer steps that read one parameter buffer and write another, checking the gradient is finite in the same pass.

A parameter server keeps its shard as a few immutable versions (replies in
flight read one while the next is written), so its step is out of place:
``dst = step(src, scale * grad)``.  Each kernel also reports whether every
gradient value was finite, so the server reads the gradient once for both.
The arithmetic is that of :mod:`psgd.kernels.optim` (the same float32
expressions, ``grad2`` included), so a step into ``dst`` equals an in-place step
on a copy of ``src``.

Finiteness: ``g - g`` is 0 for a finite value and NaN for NaN or Inf, and a
boolean OR of ``g - g != 0`` vectorizes without fast-math (which would let the
compiler assume there are no NaNs).  Accumulating it as an integer
(``np.uint32(g - g != 0)``) vectorized badly: an SGD step into ``dst`` on 1M
floats in cache took 569-588 us that way against 203-235 us (three runs).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from psgd.kernels.optim import adam_constants


@njit(cache=True)
def sgd_step_into(src, grad, dst, lr, weight_decay, scale, grad2=None):
    """``dst = src - lr * (scale * g + wd * src)``; True when every ``grad`` value is finite.

    Parameters
    ----------
    src, grad, dst : ndarray, float32 (n,)
    lr, weight_decay : float
    scale : float32
        Multiplies the gradient first (1 / count for a mean of summed gradients).
    grad2 : ndarray, float32 (n,), optional
        When given, ``g = grad + grad2`` and the check tests that sum.
    """
    lr32, wd32 = np.float32(lr), np.float32(weight_decay)
    bad = False
    for i in range(src.shape[0]):
        gi = grad[i]
        if grad2 is not None:
            gi = gi + grad2[i]
        bad |= gi - gi != 0
        p = src[i]
        dst[i] = p - lr32 * (gi * scale + wd32 * p)
    return not bad


@njit(cache=True)
def momentum_step_into(src, grad, velocity, dst, lr, momentum, weight_decay, nesterov,
                       scale, grad2=None):
    """Heavy-ball or Nesterov momentum from ``src`` into ``dst``; ``velocity`` in place.

    Returns True when every ``grad`` value is finite; when it is not,
    ``velocity`` may already hold non-finite values (check first to skip a push).

    Parameters
    ----------
    src, grad, velocity, dst : ndarray, float32 (n,)
    lr, momentum, weight_decay : float
    nesterov : bool
    scale : float32
    grad2 : ndarray, float32 (n,), optional
    """
    lr32, mu32, wd32 = np.float32(lr), np.float32(momentum), np.float32(weight_decay)
    bad = False
    for i in range(src.shape[0]):
        gi = grad[i]
        if grad2 is not None:
            gi = gi + grad2[i]
        bad |= gi - gi != 0
        p = src[i]
        g = gi * scale + wd32 * p
        v = mu32 * velocity[i] + g
        velocity[i] = v
        if nesterov:
            dst[i] = p - lr32 * (g + mu32 * v)
        else:
            dst[i] = p - lr32 * v
    return not bad


@njit(cache=True, error_model="numpy")
def adam_step_into(src, grad, m, v, dst, lr, beta1, beta2, eps, weight_decay, step, scale,
                   grad2=None):
    """One AdamW step from ``src`` into ``dst``; ``m``, ``v`` in place; True when ``grad`` is finite.

    Parameters
    ----------
    src, grad, m, v, dst : ndarray, float32 (n,)
    lr, beta1, beta2, eps, weight_decay : float
    step : int
        1-based count of updates, this one included.
    scale : float32
    grad2 : ndarray, float32 (n,), optional
    """
    c = adam_constants(lr, beta1, beta2, eps, weight_decay, step)
    b1, c1, b2, c2, eps32, decay, step_size, inv_sqrt_bc2 = c
    bad = False
    for i in range(src.shape[0]):
        gi = grad[i]
        if grad2 is not None:
            gi = gi + grad2[i]
        bad |= gi - gi != 0
        g = gi * scale
        mi = b1 * m[i] + c1 * g
        vi = b2 * v[i] + c2 * g * g
        m[i] = mi
        v[i] = vi
        p = src[i]
        dst[i] = p - (decay * p + step_size * mi / (np.sqrt(vi) * inv_sqrt_bc2 + eps32))
    return not bad


@njit(cache=True)
def add_into(total, grad, check_total=False):
    """``grad += total`` in place (so ``grad`` becomes the new sum); True when ``grad`` was finite.

    ``total`` is never written, so a non-finite push leaves the old sum intact.
    With ``check_total`` the result also covers ``total``.

    Parameters
    ----------
    total, grad : ndarray, float32 (n,)
    check_total : bool
        Check ``total``'s values too (False if either held a NaN or Inf);
        ``finite(total)`` afterwards tells which.
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


@njit(cache=True)
def finite(grad):
    """True when no value of the float32 array ``grad`` is NaN or Inf (one pass, no temporary)."""
    bad = False
    for i in range(grad.shape[0]):
        gi = grad[i]
        bad |= gi - gi != 0
    return not bad
