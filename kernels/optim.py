"""Optimizer updates over flat float32 slices: SGD, momentum (heavy-ball or Nesterov), Adam(W).

The arithmetic is float32, like the parameters (as in PyTorch): the float64
hyper-parameters are rounded to float32 once per call, so the loops vectorize
at full float32 width (a float64 ``lr`` made every element round-trip through
float64: 768 against 616 us for an out-of-place SGD step on 1M floats).
Adam's kernels compile with ``error_model="numpy"``: numba's default checks
every float division for a zero divisor, which stops the loop vectorizing
(its divisor is at least ``eps`` > 0); without the check a 1M-float step
takes 0.84 ms instead of 6.9.

Each update also takes ``scale`` (multiplies the gradient first: 1 / count
for the mean of a parameter server's summed gradients) and ``check``: True
checks every gradient value is finite in the same pass and returns False if
one is not (:mod:`psgd.kernels.step_into` has the check and the out-of-place
steps with the same expressions).  Left at False the test on ``check`` is
hoisted out of the loop: the check costs 7-10 % of an SGD step on 1M floats
in cache (362-427 against 331-401 us), and local and all-reduce training never
need it.

``grad2`` (optional): the step uses ``g = grad + grad2``, summed in float32 in
the same pass, and ``check`` tests that sum (a NaN or Inf in either, or an
overflow of the sum, makes it non-finite).  A bsp server steps on the sum of
its last two pushes this way instead of adding them in a pass of their own.
Left at None the branch is pruned at compile time, as for ``check``.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def sgd_update(params, grad, lr, weight_decay, scale=1.0, check=False, grad2=None):
    """``p -= lr * (scale * g + wd * p)`` in place; False when ``check`` finds a non-finite ``g``.

    Parameters
    ----------
    params, grad : ndarray, float32 (n,)
    lr, weight_decay, scale : float
    check : bool
    grad2 : ndarray, float32 (n,), optional
        When given, ``g = grad + grad2`` (see the module notes).
    """
    lr32, wd32, s32 = np.float32(lr), np.float32(weight_decay), np.float32(scale)
    bad = False
    for i in range(params.shape[0]):
        gi = grad[i]
        if grad2 is not None:
            gi = gi + grad2[i]
        if check:
            bad |= gi - gi != 0
        p = params[i]
        params[i] = p - lr32 * (gi * s32 + wd32 * p)
    return not bad


@njit(cache=True)
def momentum_update(params, grad, velocity, lr, momentum, weight_decay, nesterov, scale=1.0,
                    check=False, grad2=None):
    """Heavy-ball or Nesterov momentum in place (PyTorch's convention).

    ``v = mu * v + g'`` with ``g' = scale * g + wd * p``; then ``p -= lr * v``
    or, with Nesterov, ``p -= lr * (g' + mu * v)``.  Returns False when
    ``check`` finds a non-finite ``g`` value.

    Parameters
    ----------
    params, grad, velocity : ndarray, float32 (n,)
    lr, momentum, weight_decay, scale : float
    nesterov, check : bool
    grad2 : ndarray, float32 (n,), optional
        When given, ``g = grad + grad2``.
    """
    lr32, mu32, wd32 = np.float32(lr), np.float32(momentum), np.float32(weight_decay)
    s32 = np.float32(scale)
    bad = False
    for i in range(params.shape[0]):
        gi = grad[i]
        if grad2 is not None:
            gi = gi + grad2[i]
        if check:
            bad |= gi - gi != 0
        p = params[i]
        g = gi * s32 + wd32 * p
        v = mu32 * velocity[i] + g
        velocity[i] = v
        if nesterov:
            params[i] = p - lr32 * (g + mu32 * v)
        else:
            params[i] = p - lr32 * v
    return not bad


@njit(cache=True, error_model="numpy")
def adam_update(params, grad, m, v, lr, beta1, beta2, eps, weight_decay, step, scale=1.0,
                check=False, grad2=None):
    """One AdamW step in place (decoupled weight decay, bias-corrected moments).

    Returns False when ``check`` finds a non-finite ``g`` value (``grad``, or
    ``grad + grad2`` when ``grad2`` is given).

    Parameters
    ----------
    params, grad, m, v : ndarray, float32 (n,)
    lr, beta1, beta2, eps, weight_decay, scale : float
    step : int
        1-based count of updates applied so far, this one included.
    check : bool
    grad2 : ndarray, float32 (n,), optional
    """
    c = adam_constants(lr, beta1, beta2, eps, weight_decay, step)
    b1, c1, b2, c2, eps32, decay, step_size, inv_sqrt_bc2 = c
    s32 = np.float32(scale)
    bad = False
    for i in range(params.shape[0]):
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
        p = params[i]
        params[i] = p - (decay * p + step_size * mi / (np.sqrt(vi) * inv_sqrt_bc2 + eps32))
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
