"""Optimizer steps over flat float32 slices, by increasing complexity: SGD, momentum, AdaGrad, Adam(W).

Each step reads the parameters from ``src`` and writes them to ``dst``, or
back to ``src`` when ``dst`` is None, in float32 like the parameters; the float64
hyper-parameters are rounded to float32 once per call.  Each also takes
``scale`` (multiplies the gradient first), ``check`` (test the gradient for
NaN/Inf in the same pass) and ``grad2`` (step on ``grad + grad2``).
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def sgd_step(src, grad, dst, lr, weight_decay, scale=1.0, check=False, grad2=None):
    """``dst = src - lr * (scale * g + wd * src)``; False when ``check`` finds a non-finite ``g``.

    Parameters
    ----------
    src, grad : ndarray, float32 (n,)
        ``grad`` is never written.
    dst : ndarray, float32 (n,), or None
        None steps in place (writes ``src``).  Pass None rather than ``src``:
        the result is the same, but with two names for one buffer the loop
        fails LLVM's overlap check at run time and does not vectorize.
    lr, weight_decay : float
    scale : float
        Multiplies the gradient first (1 / count for the mean of summed gradients).
    check : bool
        Test every ``g`` for NaN/Inf in the step's pass (otherwise True is returned).
    grad2 : ndarray, float32 (n,), optional
        When given, ``g = grad + grad2`` summed in float32, and ``check`` tests that sum.

    Returns
    -------
    bool
        False when ``check`` found a NaN or Inf; ``dst`` then holds garbage.
    """
    out = src if dst is None else dst
    lr32, wd32, s32 = np.float32(lr), np.float32(weight_decay), np.float32(scale)
    bad = False
    for i in range(src.shape[0]):
        gi = grad[i]
        if grad2 is not None:
            gi = gi + grad2[i]
        if check:
            bad |= gi - gi != 0
        p = src[i]
        out[i] = p - lr32 * (gi * s32 + wd32 * p)
    return not bad


@njit(cache=True)
def momentum_step(src, grad, velocity, dst, lr, momentum, weight_decay, nesterov, scale=1.0,
                  check=False, grad2=None):
    """Heavy-ball or Nesterov momentum (PyTorch's convention); ``velocity`` in place.

    ``v = mu * v + g'`` with ``g' = scale * g + wd * src``; then
    ``dst = src - lr * v`` or, with Nesterov, ``dst = src - lr * (g' + mu * v)``.

    Parameters
    ----------
    src, grad, velocity : ndarray, float32 (n,)
    dst : ndarray, float32 (n,), or None
        None steps in place (see :func:`sgd_step`).
    lr, momentum, weight_decay, scale : float
    nesterov, check : bool
    grad2 : ndarray, float32 (n,), optional
        When given, ``g = grad + grad2``.

    Returns
    -------
    bool
        False when ``check`` found a NaN or Inf; ``dst`` and ``velocity`` then
        hold garbage (check first to leave them untouched).
    """
    lr32, mu32, wd32 = np.float32(lr), np.float32(momentum), np.float32(weight_decay)
    s32 = np.float32(scale)
    out = src if dst is None else dst
    bad = False
    for i in range(src.shape[0]):
        gi = grad[i]
        if grad2 is not None:
            gi = gi + grad2[i]
        if check:
            bad |= gi - gi != 0
        p = src[i]
        g = gi * s32 + wd32 * p
        v = mu32 * velocity[i] + g
        velocity[i] = v
        if nesterov:
            out[i] = p - lr32 * (g + mu32 * v)
        else:
            out[i] = p - lr32 * v
    return not bad


@njit(cache=True)
def momentum_direction(grad, params, velocity, out, momentum, weight_decay, nesterov):
    """The direction of a momentum step, for a step applied elsewhere; ``velocity`` in place.

    ``v = mu * v + g'`` with ``g' = g + wd * params``; ``out = v`` or, with
    Nesterov, ``out = g' + mu * v``, so that ``params - lr * out`` is
    :func:`momentum_step`'s result.  ``out`` may be ``grad``.
    """
    mu32, wd32 = np.float32(momentum), np.float32(weight_decay)
    for i in range(grad.shape[0]):
        g = grad[i] + wd32 * params[i]
        v = mu32 * velocity[i] + g
        velocity[i] = v
        out[i] = g + mu32 * v if nesterov else v


@njit(cache=True, error_model="numpy")
def adagrad_step(src, grad, acc, dst, lr, eps, weight_decay, scale=1.0, check=False, grad2=None):
    """One AdaGrad step (Duchi et al. 2011, PyTorch's convention); ``acc`` in place.

    ``g' = scale * g + wd * src``; ``acc += g' * g'``; ``dst = src - lr * g' / (sqrt(acc) + eps)``.
    A coordinate whose ``g'`` is 0 is left exactly as it was (parameter and accumulator),
    so a sparse gradient changes only its nonzero coordinates.

    Parameters
    ----------
    src, grad, acc : ndarray, float32 (n,)
    dst : ndarray, float32 (n,), or None
        None steps in place (see :func:`sgd_step`).
    lr, eps, weight_decay, scale : float
    check : bool
    grad2 : ndarray, float32 (n,), optional
        When given, ``g = grad + grad2``.

    Returns
    -------
    bool
        False when ``check`` found a NaN or Inf; ``dst`` and ``acc`` then hold garbage.
    """
    lr32, eps32, wd32, s32 = np.float32(lr), np.float32(eps), np.float32(weight_decay), \
        np.float32(scale)
    out = src if dst is None else dst
    bad = False
    for i in range(src.shape[0]):
        gi = grad[i]
        if grad2 is not None:
            gi = gi + grad2[i]
        if check:
            bad |= gi - gi != 0
        p = src[i]
        g = gi * s32 + wd32 * p
        a = acc[i] + g * g
        acc[i] = a
        out[i] = p - lr32 * g / (np.sqrt(a) + eps32)
    return not bad


@njit(cache=True)
def adam_constants(lr, beta1, beta2, eps, weight_decay, step):
    """The float32 scalars of one Adam step, worked out in float64 and rounded once.

    Returns ``(beta1, 1 - beta1, beta2, 1 - beta2, eps, lr * weight_decay,
    lr / (1 - beta1**step), 1 / sqrt(1 - beta2**step))``.
    """
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    f = np.float32
    return (f(beta1), f(1.0 - beta1), f(beta2), f(1.0 - beta2), f(eps), f(lr * weight_decay),
            f(lr / bc1), f(1.0 / np.sqrt(bc2)))


@njit(cache=True, error_model="numpy")
def adam_step(src, grad, m, v, dst, lr, beta1, beta2, eps, weight_decay, step, scale=1.0,
              check=False, grad2=None):
    """One AdamW step (decoupled weight decay, bias-corrected moments); ``m``, ``v`` in place.

    Compiled with ``error_model="numpy"``: numba's default tests every float
    division for a zero divisor, which stops the loop vectorizing (the divisor
    here is at least ``eps`` > 0).

    Parameters
    ----------
    src, grad, m, v : ndarray, float32 (n,)
    dst : ndarray, float32 (n,), or None
        None steps in place (see :func:`sgd_step`).
    lr, beta1, beta2, eps, weight_decay, scale : float
    step : int
        1-based count of updates applied so far, this one included.
    check : bool
    grad2 : ndarray, float32 (n,), optional
        When given, ``g = grad + grad2``.

    Returns
    -------
    bool
        False when ``check`` found a NaN or Inf; ``dst``, ``m`` and ``v`` then hold garbage.
    """
    c = adam_constants(lr, beta1, beta2, eps, weight_decay, step)
    b1, c1, b2, c2, eps32, decay, step_size, inv_sqrt_bc2 = c
    s32 = np.float32(scale)
    out = src if dst is None else dst
    bad = False
    for i in range(src.shape[0]):
        gi = grad[i]
        if grad2 is not None:
            gi = gi + grad2[i]
        if check:
            bad |= gi - gi != 0
        g = gi * s32
        mi = b1 * m[i] + c1 * g
        vi = b2 * v[i] + c2 * g * g
        m[i] = mi
        v[i] = vi
        p = src[i]
        out[i] = p - (decay * p + step_size * mi / (np.sqrt(vi) * inv_sqrt_bc2 + eps32))
    return not bad
