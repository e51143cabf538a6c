"""ReLU kernels over flat (1-D) views, forward beside backward."""
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
