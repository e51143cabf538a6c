"""The join of a residual block, ``out = relu(a + b)``, and the sum of its two branches' input gradients."""
from numba import njit


@njit(cache=True)
def add_relu_forward(a, b, out):
    """``out = max(a + b, 0)`` elementwise; ``out`` may be ``a`` or ``b``.

    Parameters
    ----------
    a, b : (n,) float32 or float64 (the main branch and the shortcut)
    out : (n,) same dtype, overwritten

    Returns
    -------
    out : the same array

    Notes
    -----
    Its backward is :func:`psgd.kernels.activation.relu_backward` on ``out``: both
    branches receive the same gradient.
    """
    for i in range(a.shape[0]):
        v = a[i] + b[i]
        out[i] = v if v > 0 else 0.0
    return out


@njit(cache=True)
def accumulate(dst, src):
    """``dst += src`` elementwise (the input gradient of a block: main branch plus shortcut).

    Parameters
    ----------
    dst : (n,) overwritten
    src : (n,) same dtype

    Returns
    -------
    dst : the same array
    """
    for i in range(dst.shape[0]):
        dst[i] += src[i]
    return dst
