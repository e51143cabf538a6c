"""Dense (affine) layer kernels, y = x @ W + b with W stored (n_in, n_out), forward beside backward."""
import numpy as np
from numba import njit


@njit(cache=True)
def dense_forward(x, w, b, out):
    """Affine forward pass, written into ``out``.

    Parameters
    ----------
    x : (B, n_in) float32 or float64, C-contiguous
    w : (n_in, n_out) same dtype; row i holds the weights from input feature i
    b : (n_out,) same dtype
    out : (B, n_out) same dtype, overwritten with ``x @ w + b``

    Returns
    -------
    out : the same array
    """
    np.dot(x, w, out)
    n, m = out.shape
    for i in range(n):
        for j in range(m):
            out[i, j] += b[j]
    return out


@njit(cache=True)
def dense_backward_params(x, dout, dw, db):
    """Parameter gradients of the affine layer, overwriting ``dw`` and ``db``.

    Parameters
    ----------
    x : (B, n_in) the forward input
    dout : (B, n_out) gradient of the loss w.r.t. the forward output
    dw : (n_in, n_out) overwritten with ``x.T @ dout``
    db : (n_out,) overwritten with ``dout.sum(axis=0)``
    """
    np.dot(x.T, dout, dw)
    n, m = dout.shape
    for j in range(m):
        db[j] = 0.0
    for i in range(n):
        for j in range(m):
            db[j] += dout[i, j]


@njit(cache=True)
def dense_backward_input(w, dout, dx):
    """Input gradient of the affine layer: ``dx = dout @ w.T``.

    Parameters
    ----------
    w : (n_in, n_out)
    dout : (B, n_out)
    dx : (B, n_in) overwritten

    Returns
    -------
    dx : the same array
    """
    np.dot(dout, w.T, dx)
    return dx
