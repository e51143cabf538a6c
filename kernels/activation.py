"""Elementwise activations (ReLU, leaky ReLU, tanh, sigmoid) over flat (1-D) views, forward beside backward."""
import numpy as np
from numba import njit


@njit(cache=True)
def relu_forward(x, out):
    """``out = max(x, 0)`` elementwise; ``out`` may be ``x`` (in place).

    Parameters
    ----------
    x : (n,) float32 or float64
    out : (n,) same dtype, overwritten

    Returns
    -------
    out : the same array
    """
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = v if v > 0 else 0.0
    return out


@njit(cache=True)
def relu_backward(out, dout, dx):
    """``dx = dout * (out > 0)`` where ``out`` is the forward output; ``dx`` may be ``dout``.

    Parameters
    ----------
    out : (n,) forward output (positive exactly where the input was positive)
    dout : (n,) gradient w.r.t. the forward output
    dx : (n,) overwritten with the gradient w.r.t. the forward input

    Returns
    -------
    dx : the same array
    """
    for i in range(out.shape[0]):
        g = dout[i]  # both loads unconditional, so LLVM emits a select, not a branch
        m = out[i]
        dx[i] = g if m > 0 else 0.0
    return dx


@njit(cache=True)
def leaky_relu_forward(x, alpha, out):
    """``out = x if x > 0 else alpha * x`` elementwise (0 < alpha < 1); ``out`` may be ``x``.

    Parameters
    ----------
    x : (n,) float32 or float64
    alpha : float, the slope for negative inputs
    out : (n,) same dtype, overwritten

    Returns
    -------
    out : the same array
    """
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = v if v > 0 else alpha * v
    return out


@njit(cache=True)
def leaky_relu_backward(out, alpha, dout, dx):
    """``dx = dout * (1 if out > 0 else alpha)``; ``out`` is the forward output (same sign as
    its input for alpha > 0); ``dx`` may be ``dout``.

    Parameters
    ----------
    out, dout : (n,) forward output and the gradient w.r.t. it
    alpha : float
    dx : (n,) overwritten

    Returns
    -------
    dx : the same array
    """
    for i in range(out.shape[0]):
        g = dout[i]
        dx[i] = g if out[i] > 0 else alpha * g
    return dx


@njit(cache=True)
def tanh_forward(x, out):
    """``out = tanh(x)`` elementwise; ``out`` may be ``x``.

    Parameters
    ----------
    x, out : (n,) float32 or float64

    Returns
    -------
    out : the same array
    """
    for i in range(x.shape[0]):
        out[i] = np.tanh(x[i])
    return out


@njit(cache=True)
def tanh_backward(out, dout, dx):
    """``dx = dout * (1 - out**2)`` with ``out = tanh(x)``; ``dx`` may be ``dout``.

    Parameters
    ----------
    out, dout, dx : (n,)

    Returns
    -------
    dx : the same array
    """
    for i in range(out.shape[0]):
        t = out[i]
        dx[i] = dout[i] * (1.0 - t * t)
    return dx


@njit(cache=True)
def sigmoid_forward(x, out):
    """``out = 1 / (1 + exp(-x))`` elementwise, without overflow for large ``|x|``; ``out`` may be ``x``.

    Parameters
    ----------
    x, out : (n,) float32 or float64

    Returns
    -------
    out : the same array
    """
    for i in range(x.shape[0]):
        v = x[i]
        if v >= 0:
            out[i] = 1.0 / (1.0 + np.exp(-v))
        else:
            e = np.exp(v)
            out[i] = e / (1.0 + e)
    return out


@njit(cache=True)
def sigmoid_backward(out, dout, dx):
    """``dx = dout * out * (1 - out)`` with ``out = sigmoid(x)``; ``dx`` may be ``dout``.

    Parameters
    ----------
    out, dout, dx : (n,)

    Returns
    -------
    dx : the same array
    """
    for i in range(out.shape[0]):
        s = out[i]
        dx[i] = dout[i] * s * (1.0 - s)
    return dx
