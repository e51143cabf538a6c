"""Dense (affine) layer kernels, y = x @ W + b (then an optional ReLU), forward beside backward."""
import numpy as np
from numba import njit


@njit(cache=True)
def dense_forward(x, w, b, out, relu=False):
    """Affine forward pass (then ``max(., 0)`` when ``relu``), written into ``out``.

    Parameters
    ----------
    x : (B, n_in) float32 or float64, C-contiguous
    w : (n_in, n_out) same dtype; row i holds the weights from input feature i
    b : (n_out,) same dtype
    out : (B, n_out) same dtype, overwritten with ``x @ w + b``
    relu : bool
        Apply a ReLU in the bias pass: ``out = max(x @ w + b, 0)``.

    Returns
    -------
    out : the same array
    """
    np.dot(x, w, out)
    n, m = out.shape
    for i in range(n):
        for j in range(m):
            v = out[i, j] + b[j]
            out[i, j] = v if not relu or v > 0 else 0.0
    return out


@njit(cache=True)
def dense_backward_params(x, dout, dw, db, relu_out=None):
    """Parameter gradients of the affine layer, overwriting ``dw`` and ``db``.

    Parameters
    ----------
    x : (B, n_in) the forward input
    dout : (B, n_out) gradient of the loss w.r.t. the forward output
    dw : (n_in, n_out) overwritten with ``x.T @ dout``
    db : (n_out,) overwritten with ``dout.sum(axis=0)``
    relu_out : (B, n_out), optional
        The output of a forward pass with ``relu=True``: ``dout`` is first overwritten
        with ``dout * (relu_out > 0)``, the gradient w.r.t. the affine output, in the
        pass that sums ``db`` (the caller's ``dx`` then comes from the masked ``dout``).
    """
    n, m = dout.shape
    for j in range(m):
        db[j] = 0.0
    for i in range(n):
        for j in range(m):
            g = dout[i, j]
            if relu_out is not None:  # both loads unconditional, so a select, not a branch
                r = relu_out[i, j]
                g = g if r > 0 else 0.0
                dout[i, j] = g
            db[j] += g
    np.dot(x.T, dout, dw)


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
