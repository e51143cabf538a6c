"""Batch normalisation over the rows of (N, C) views (N = B*H*W for channels-last images), forward beside backward."""
import numpy as np
from numba import njit


@njit(cache=True)
def _affine(mean, invstd, dtype):
    """``xhat = x * a + b``: the per-column scale and shift that normalise, in the data's dtype."""
    c = mean.shape[0]
    a = np.empty(c, dtype)
    b = np.empty(c, dtype)
    for j in range(c):
        a[j] = invstd[j]
        b[j] = -mean[j] * invstd[j]
    return a, b


@njit(cache=True)
def batchnorm_forward_train(x, gamma, beta, eps, relu, out, mean, invstd):
    """Normalise each column with the batch's own mean and (biased) variance, then scale and
    shift (and apply a ReLU when ``relu``).

    Parameters
    ----------
    x : (N, C) float32 or float64, C-contiguous
    gamma, beta : (C,) same dtype
    eps : float, added to the variance
    relu : bool, whether ``out`` is ``max(gamma * xhat + beta, 0)``
    out : (N, C) overwritten with ``gamma * xhat + beta`` where ``xhat = (x - mean) * invstd``
    mean, invstd : (C,) float64, overwritten with the batch mean and ``1 / sqrt(var + eps)``;
        keep them (and ``x``, ``out``) for the backward pass

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
    for j in range(c):
        m = s1[j] / n
        mean[j] = shift[j] + m
        invstd[j] = 1.0 / np.sqrt(max(s2[j] / n - m * m, 0.0) + eps)
    a, b = _affine(mean, invstd, x.dtype)
    for i in range(n):
        for j in range(c):
            v = gamma[j] * (x[i, j] * a[j] + b[j]) + beta[j]
            out[i, j] = v if not relu or v > 0 else 0.0
    return out


@njit(cache=True)
def batchnorm_forward_eval(x, gamma, beta, mean, var, eps, relu, out):
    """Normalise with fixed statistics: ``out = gamma * (x - mean) / sqrt(var + eps) + beta``
    (then ``max(out, 0)`` when ``relu``).

    Parameters
    ----------
    x : (N, C) float32 or float64
    gamma, beta : (C,) same dtype
    mean, var : (C,) float64, the evaluation statistics
    eps : float
    relu : bool
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
            v = a[j] * x[i, j] + s[j]
            out[i, j] = v if not relu or v > 0 else 0.0
    return out


@njit(cache=True)
def batchnorm_backward(dout, x, mean, invstd, gamma, out, relu, dx, dgamma, dbeta):
    """Gradients of :func:`batchnorm_forward_train` (the batch statistics depend on ``x`` too).

    Parameters
    ----------
    dout : (N, C) gradient w.r.t. the output
    x, mean, invstd, out : the forward pass's input, statistics and output (``xhat`` is
        recomputed from ``x`` as the forward pass computed it)
    gamma : (C,)
    relu : bool, as in the forward pass: ``dout`` counts only where ``out > 0``
    dx : (N, C) overwritten with ``gamma * invstd / N * (N*g - sum(g) - xhat * sum(g*xhat))``,
        ``g`` being ``dout`` (masked by the ReLU)
    dgamma, dbeta : (C,) overwritten with ``sum(g * xhat)`` and ``sum(g)`` over the rows

    Returns
    -------
    dx : the same array
    """
    n, c = dout.shape
    a, b = _affine(mean, invstd, x.dtype)
    sg = np.zeros(c, np.float64)
    sb = np.zeros(c, np.float64)
    for i in range(n):
        for j in range(c):
            g = dout[i, j]
            if relu:  # loop-invariant: LLVM unswitches it; both loads unconditional, a select
                m = out[i, j]
                g = g if m > 0 else 0.0
            sb[j] += g
            sg[j] += g * (x[i, j] * a[j] + b[j])
    for j in range(c):
        dgamma[j] = sg[j]
        dbeta[j] = sb[j]
    k = np.empty(c, np.float64)
    for j in range(c):
        k[j] = gamma[j] * invstd[j] / n
    for i in range(n):
        for j in range(c):
            g = dout[i, j]
            if relu:  # loop-invariant: LLVM unswitches it; both loads unconditional, a select
                m = out[i, j]
                g = g if m > 0 else 0.0
            dx[i, j] = k[j] * (n * g - sb[j] - (x[i, j] * a[j] + b[j]) * sg[j])
    return dx


# -- a batch split over ranks: partial sums here, the group's statistics combined by the caller --
@njit(cache=True)
def batchnorm_shifted_sums(x, shift, s1, s2):
    """This part's sums of ``x - shift`` and of its square per column, for statistics over a
    batch split over ranks (:func:`batchnorm_forward_train` does the same on a whole batch).

    Parameters
    ----------
    x : (N, C) float32 or float64, C-contiguous; N may be 0
    shift, s1, s2 : (C,) float64, overwritten with ``x[0]`` (0 when N is 0), the sum of
        ``x - shift`` and the sum of its square

    Returns
    -------
    s1 : the same array
    """
    n, c = x.shape
    for j in range(c):
        shift[j] = x[0, j] if n else 0.0
        s1[j] = 0.0
        s2[j] = 0.0
    for i in range(n):
        for j in range(c):
            d = x[i, j] - shift[j]
            s1[j] += d
            s2[j] += d * d
    return s1


@njit(cache=True)
def batchnorm_normalise(x, gamma, beta, mean, invstd, relu, out):
    """``out = gamma * xhat + beta`` (then ``max(out, 0)`` when ``relu``) with the given
    statistics, ``xhat`` as :func:`batchnorm_forward_train` computes it (in the data's dtype).

    Parameters
    ----------
    x : (N, C) float32 or float64
    gamma, beta : (C,) same dtype
    mean, invstd : (C,) float64, the (group's) batch mean and ``1 / sqrt(var + eps)``
    relu : bool
    out : (N, C) overwritten

    Returns
    -------
    out : the same array
    """
    n, c = x.shape
    a, b = _affine(mean, invstd, x.dtype)
    for i in range(n):
        for j in range(c):
            v = gamma[j] * (x[i, j] * a[j] + b[j]) + beta[j]
            out[i, j] = v if not relu or v > 0 else 0.0
    return out


@njit(cache=True)
def batchnorm_backward_sums(dout, x, mean, invstd, out, relu, sb, sg):
    """This part's ``sum(g)`` and ``sum(g * xhat)`` per column (``g``: ``dout`` masked by the
    ReLU), the sums :func:`batchnorm_backward` forms over a whole batch, in float64.

    Parameters
    ----------
    dout, x, out : (N, C) the gradient, the forward pass's input and output
    mean, invstd : (C,) float64, the statistics the forward pass normalised with
    relu : bool
    sb, sg : (C,) float64, overwritten with the two sums

    Returns
    -------
    sb : the same array
    """
    n, c = dout.shape
    a, b = _affine(mean, invstd, x.dtype)
    for j in range(c):
        sb[j] = 0.0
        sg[j] = 0.0
    for i in range(n):
        for j in range(c):
            g = dout[i, j]
            if relu:
                m = out[i, j]
                g = g if m > 0 else 0.0
            sb[j] += g
            sg[j] += g * (x[i, j] * a[j] + b[j])
    return sb


@njit(cache=True)
def batchnorm_backward_dx(dout, x, mean, invstd, gamma, out, relu, count, sb, sg, dx):
    """The input gradient of batch norm over ``count`` rows in all, of which these are some:
    ``dx = gamma * invstd / count * (count*g - sb - xhat * sg)`` with the whole batch's
    :func:`batchnorm_backward_sums` ``sb`` and ``sg``.

    Parameters
    ----------
    dout, x, out : (N, C) as in :func:`batchnorm_backward_sums`
    mean, invstd : (C,) float64
    gamma : (C,)
    relu : bool
    count : float, the rows of the whole batch (over every part)
    sb, sg : (C,) float64, the whole batch's sums
    dx : (N, C) overwritten

    Returns
    -------
    dx : the same array
    """
    n, c = dout.shape
    a, b = _affine(mean, invstd, x.dtype)
    k = np.empty(c, np.float64)
    for j in range(c):
        k[j] = gamma[j] * invstd[j] / count
    for i in range(n):
        for j in range(c):
            g = dout[i, j]
            if relu:
                m = out[i, j]
                g = g if m > 0 else 0.0
            dx[i, j] = k[j] * (count * g - sb[j] - (x[i, j] * a[j] + b[j]) * sg[j])
    return dx
