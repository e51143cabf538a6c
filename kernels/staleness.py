"""Staleness compensation of one push: a gradient rewritten from where it was read and where it lands."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy")
def dcasgd_grad(grad, now, read, meansq, out, lam0, rho):
    """DC-ASGD-a (Zheng et al. 2017): ``out = g + lam0 * g*g * (now - read) / sqrt(ms)``.

    ``ms = rho * ms + (1 - rho) * g*g`` is updated in place first (elementwise
    mean square of the gradient, the adaptive ``lambda_t = lam0 / sqrt(ms)``).

    Parameters
    ----------
    grad, now, read, meansq, out : ndarray, float32 (n,)
        ``out`` may not alias ``grad``; ``meansq`` is written.
    lam0, rho : float

    Returns
    -------
    float
        ``|correction| / |g|`` over the slice (0 for a zero gradient).
    """
    lam, r, r1 = np.float32(lam0), np.float32(rho), np.float32(1.0 - rho)
    tiny = np.float32(1e-20)
    corr2 = 0.0
    g2sum = 0.0
    for i in range(grad.shape[0]):
        g = grad[i]
        gg = g * g
        ms = r * meansq[i] + r1 * gg
        meansq[i] = ms
        c = lam * gg * (now[i] - read[i]) / np.sqrt(ms + tiny)
        out[i] = g + c
        corr2 += c * c
        g2sum += gg
    return np.sqrt(corr2 / g2sum) if g2sum > 0 else 0.0


@njit(cache=True, error_model="numpy")
def gap_grad(grad, now, read, meansq, out, step_scale, rho):
    """Gap-Aware (Barkai et al. 2020): ``out = g / (1 + |now - read| / (step_scale * sqrt(ms)))``.

    ``ms`` (updated in place first, as in :func:`dcasgd_grad`) estimates the
    gradient's scale, so ``step_scale * sqrt(ms)`` is one typical update of an
    element and the gap counts how many such updates separate the read from now.

    Returns
    -------
    float
        The mean of the factor ``1 / (1 + gap)`` over the slice.
    """
    s, r, r1 = np.float32(step_scale), np.float32(rho), np.float32(1.0 - rho)
    tiny = np.float32(1e-20)
    total = 0.0
    for i in range(grad.shape[0]):
        g = grad[i]
        ms = r * meansq[i] + r1 * g * g
        meansq[i] = ms
        f = np.float32(1.0) / (np.float32(1.0) + np.abs(now[i] - read[i]) / (s * np.sqrt(ms) + tiny))
        out[i] = g * f
        total += f
    return total / grad.shape[0] if grad.shape[0] else 1.0



@njit(cache=True)
def dana_push(grad, now, velocity, total, gamma, weight_decay, scale=1.0):
    """One worker's push into its own velocity (DANA-Zero): ``v = gamma v + g + wd * now``,
    ``g`` the push times ``scale``; the server steps with the new ``v``.

    ``total`` (the sum of every worker's velocity) moves by the same change.

    Parameters
    ----------
    grad, now : ndarray, float32 (n,)
        Only read.
    velocity, total : ndarray, float32 (n,)
        Written.
    gamma, weight_decay, scale : float
    """
    m, wd, a = np.float32(gamma), np.float32(weight_decay), np.float32(scale)
    for i in range(grad.shape[0]):
        old = velocity[i]
        new = m * old + (a * grad[i] + wd * now[i])
        total[i] += new - old
        velocity[i] = new


@njit(cache=True)
def dana_reply(live, total, velocity, out, coef, own):
    """The look-ahead a pull is answered with:
    ``out = live + coef * (total - velocity) + own * velocity``.

    ``total - velocity`` is the other workers' velocities, ``velocity`` the
    puller's own; ``coef`` and ``own`` (negative) are how far the pushes
    expected before and with the puller's are to carry the parameters.
    """
    c, o = np.float32(coef), np.float32(own)
    for i in range(live.shape[0]):
        v = velocity[i]
        out[i] = live[i] + c * (total[i] - v) + o * v


@njit(cache=True, error_model="numpy")
def adam_reply(live, m, v, out, coef, inv_sqrt_bc2, eps):
    """Adam's look-ahead a pull is answered with:
    ``out = live - coef * m / (sqrt(v) * inv_sqrt_bc2 + eps)``.

    ``m / (sqrt(v) * inv_sqrt_bc2 + eps)`` is Adam's step direction without the
    first moment's bias correction, which ``coef`` carries with the learning
    rate and the number of steps looked ahead by (the divisor is at least
    ``eps`` > 0, so numpy's error model lets the loop vectorize).
    """
    c, s, e = np.float32(coef), np.float32(inv_sqrt_bc2), np.float32(eps)
    for i in range(live.shape[0]):
        out[i] = live[i] - c * m[i] / (np.sqrt(v[i]) * s + e)
