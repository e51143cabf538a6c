"""Batch normalisation over the rows of (N, C) views (N = B*H*W for channels-last images), forward beside backward."""
import numpy as np
from numba import njit


@njit(cache=True)
def batchnorm_forward_train(x, gamma, beta, eps, out, xhat, mean, invstd):
    """Normalise each column with the batch's own mean and (biased) variance, then scale and shift.

    Parameters
    ----------
    x : (N, C) float32 or float64, C-contiguous
    gamma, beta : (C,) same dtype
    eps : float, added to the variance
    out : (N, C) overwritten with ``gamma * xhat + beta``
    xhat : (N, C) overwritten with ``(x - mean) * invstd``; keep it for the backward pass
    mean, invstd : (C,) float64, overwritten with the batch mean and ``1 / sqrt(var + eps)``

    Returns
    -------
    out : the same array

    Notes
    -----
    One pass sums ``x - x[0]`` and its square in float64 (shifting by the first row keeps
    the variance accurate when the mean is large against the spread); a second writes.
    """
    n, c = x.shape
    s1 = np.zeros(c, np.float64)
    s2 = np.zeros(c, np.float64)
    shift = np.empty(c, np.float64)
    for j in range(c):
        shift[j] = x[0, j]
    for i in range(n):
        for j in range(c):
            d = x[i, j] - shift[j]
            s1[j] += d
            s2[j] += d * d
    a = np.empty(c, x.dtype)
    b = np.empty(c, x.dtype)
    for j in range(c):
        m = s1[j] / n
        mean[j] = shift[j] + m
        invstd[j] = 1.0 / np.sqrt(max(s2[j] / n - m * m, 0.0) + eps)
        a[j] = invstd[j]
        b[j] = -mean[j] * invstd[j]
    for i in range(n):
        for j in range(c):
            h = x[i, j] * a[j] + b[j]
            xhat[i, j] = h
            out[i, j] = gamma[j] * h + beta[j]
    return out


@njit(cache=True)
def batchnorm_forward_eval(x, gamma, beta, mean, var, eps, out):
    """Normalise with fixed statistics: ``out = gamma * (x - mean) / sqrt(var + eps) + beta``.

    Parameters
    ----------
    x : (N, C) float32 or float64
    gamma, beta : (C,) same dtype
    mean, var : (C,) float64, the evaluation statistics
    eps : float
    out : (N, C) overwritten (may be ``x``)

    Returns
    -------
    out : the same array
    """
    n, c = x.shape
    a = np.empty(c, np.float64)
    s = np.empty(c, np.float64)
    for j in range(c):
        a[j] = gamma[j] / np.sqrt(var[j] + eps)
        s[j] = beta[j] - a[j] * mean[j]
    for i in range(n):
        for j in range(c):
            out[i, j] = a[j] * x[i, j] + s[j]
    return out


@njit(cache=True)
def batchnorm_backward(dout, xhat, invstd, gamma, dx, dgamma, dbeta):
    """Gradients of :func:`batchnorm_forward_train` (the batch statistics depend on ``x`` too).

    Parameters
    ----------
    dout : (N, C) gradient w.r.t. the output
    xhat, invstd : from the forward pass
    gamma : (C,)
    dx : (N, C) overwritten with ``gamma * invstd / N * (N*dout - sum(dout) - xhat * sum(dout*xhat))``
    dgamma, dbeta : (C,) overwritten with ``sum(dout * xhat)`` and ``sum(dout)`` over the rows

    Returns
    -------
    dx : the same array
    """
    n, c = dout.shape
    sg = np.zeros(c, np.float64)
    sb = np.zeros(c, np.float64)
    for i in range(n):
        for j in range(c):
            g = dout[i, j]
            sb[j] += g
            sg[j] += g * xhat[i, j]
    for j in range(c):
        dgamma[j] = sg[j]
        dbeta[j] = sb[j]
    a = np.empty(c, np.float64)
    for j in range(c):
        a[j] = gamma[j] * invstd[j] / n
    for i in range(n):
        for j in range(c):
            dx[i, j] = a[j] * (n * dout[i, j] - sb[j] - xhat[i, j] * sg[j])
    return dx
