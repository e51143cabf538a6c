"""Inverted dropout over flat (1-D) views, forward beside backward; the caller draws the uniforms."""
from numba import njit


@njit(cache=True)
def dropout_forward(x, u, p, out):
    """Keep ``x[i] / (1 - p)`` where ``u[i] >= p``, else 0; ``out`` may be ``x``.

    Parameters
    ----------
    x : (n,) float32 or float64
    u : (n,) uniforms in [0, 1) (float32); the same array goes to :func:`dropout_backward`
    p : float in [0, 1), the drop probability
    out : (n,) same dtype as ``x``, overwritten

    Returns
    -------
    out : the same array
    """
    scale = 1.0 / (1.0 - p)
    for i in range(x.shape[0]):
        v = x[i] * scale
        out[i] = v if u[i] >= p else 0.0
    return out


@njit(cache=True)
def dropout_backward(dout, u, p, dx):
    """``dx = dout / (1 - p)`` where the forward kept its input, else 0; ``dx`` may be ``dout``.

    Parameters
    ----------
    dout : (n,)
    u : (n,) the uniforms of the forward pass
    p : float
    dx : (n,) overwritten

    Returns
    -------
    dx : the same array
    """
    scale = 1.0 / (1.0 - p)
    for i in range(dout.shape[0]):
        g = dout[i] * scale
        dx[i] = g if u[i] >= p else 0.0
    return dx
