"""Optimizer updates over flat float32 slices: SGD, momentum (heavy-ball or Nesterov), Adam(W)."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def sgd_update(params, grad, lr, weight_decay):
    """``p -= lr * (g + wd * p)`` in place.

    Parameters
    ----------
    params, grad : ndarray, float32 (n,)
    lr, weight_decay : float
    """
    for i in range(params.shape[0]):
        params[i] -= lr * (grad[i] + weight_decay * params[i])


@njit(cache=True)
def momentum_update(params, grad, velocity, lr, momentum, weight_decay, nesterov):
    """Heavy-ball or Nesterov momentum in place (PyTorch's convention).

    ``v = mu * v + g'`` with ``g' = g + wd * p``; then ``p -= lr * v`` or, with
    Nesterov, ``p -= lr * (g' + mu * v)``.

    Parameters
    ----------
    params, grad, velocity : ndarray, float32 (n,)
    lr, momentum, weight_decay : float
    nesterov : bool
    """
    for i in range(params.shape[0]):
        g = grad[i] + weight_decay * params[i]
        v = momentum * velocity[i] + g
        velocity[i] = v
        if nesterov:
            params[i] -= lr * (g + momentum * v)
        else:
            params[i] -= lr * v


@njit(cache=True)
def adam_update(params, grad, m, v, lr, beta1, beta2, eps, weight_decay, step):
    """One AdamW step in place (decoupled weight decay, bias-corrected moments).

    Parameters
    ----------
    params, grad, m, v : ndarray, float32 (n,)
    lr, beta1, beta2, eps, weight_decay : float
    step : int
        1-based count of updates applied so far, this one included.
    """
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    step_size = lr / bc1
    inv_sqrt_bc2 = 1.0 / np.sqrt(bc2)
    for i in range(params.shape[0]):
        g = grad[i]
        mi = beta1 * m[i] + (1.0 - beta1) * g
        vi = beta2 * v[i] + (1.0 - beta2) * g * g
        m[i] = mi
        v[i] = vi
        params[i] -= lr * weight_decay * params[i] + step_size * mi / (np.sqrt(vi) * inv_sqrt_bc2 + eps)
