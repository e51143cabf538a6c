"""2-D convolution kernels on channels-last (B, H, W, C) arrays via im2col and BLAS, forward beside backward."""
# Parameter layout: one (KH*KW*C + 1, F) matrix ``wb`` whose first KH*KW*C rows are the
# weights in (kh, kw, c) order (a (KH, KW, C, F) array viewed flat) and whose last row is
# the bias.  The im2col matrix carries a matching last column of ones, so one GEMM gives
# output plus bias and one GEMM gives weight and bias gradients together.  In a model's
# flat vector the weights are followed by the bias, so ``wb`` is a plain view.  The
# product ``cols @ wb`` is (B*OH*OW, F): the channels-last output, with no transpose.
import numpy as np
from numba import njit


def conv_out_size(n, k, stride, pad):
    """Output length of a convolved axis of length ``n``."""
    return (n + 2 * pad - k) // stride + 1


@njit(cache=True)
def im2col(x, kh, kw, stride, pad, cols):
    """Unfold input patches into rows of ``cols`` (zeros in the padding, ones in a last column).

    Parameters
    ----------
    x : (B, H, W, C) float32 or float64, C-contiguous
    kh, kw, stride, pad : int
    cols : (B*OH*OW, KH*KW*C + 1) same dtype, overwritten; row ``(b*OH + oh)*OW + ow``
        holds ``x[b, oh*stride - pad + i, ow*stride - pad + j, c]`` at column
        ``(i*KW + j)*C + c`` and 1 in its last column (the bias input)

    Returns
    -------
    cols : the same array

    Notes
    -----
    In channels-last layout the ``KW*C`` values of one patch row are contiguous in both
    ``x`` and ``cols``, so each (output pixel, kernel row) is one contiguous copy.
    """
    nb, h, w, c = x.shape
    oh_n = (h + 2 * pad - kh) // stride + 1
    ow_n = (w + 2 * pad - kw) // stride + 1
    xf = x.reshape(nb, h * w * c)
    seg = kw * c
    last = kh * seg
    row = 0
    # copies go through 1-D slice views indexed from 0: LLVM then drops the negative-index
    # checks and vectorises the copy (about 2x faster than indexing cols[row, base + t])
    for b in range(nb):
        xb = xf[b]
        for oh in range(oh_n):
            for ow in range(ow_n):
                w0 = ow * stride - pad
                lo = max(0, -w0) * c            # columns [lo, hi) of a patch row are inside x
                hi = min(kw, w - w0) * c
                crow = cols[row]
                for i in range(kh):
                    ih = oh * stride - pad + i
                    dst = crow[i * seg:(i + 1) * seg]
                    if ih < 0 or ih >= h or hi <= lo:
                        for t in range(seg):
                            dst[t] = 0.0
                        continue
                    src = xb[(ih * w + w0) * c + lo:(ih * w + w0) * c + hi]
                    if lo == 0 and hi == seg:
                        for t in range(seg):
                            dst[t] = src[t]
                    else:  # one fixed-length loop, no memset/memcpy calls for short rows (C = 1)
                        for t in range(seg):
                            if t >= lo and t < hi:
                                dst[t] = src[t - lo]
                            else:
                                dst[t] = 0.0
                crow[last] = 1.0
                row += 1
    return cols


@njit(cache=True)
def col2im(dcols, kh, kw, stride, pad, dx):
    """Fold rows of ``dcols`` back onto the input, summing overlaps (adjoint of :func:`im2col`).

    Parameters
    ----------
    dcols : (B*OH*OW, KH*KW*C) (a trailing bias column, if present, is ignored)
    kh, kw, stride, pad : int
    dx : (B, H, W, C) same dtype, C-contiguous, overwritten

    Returns
    -------
    dx : the same array
    """
    nb, h, w, c = dx.shape
    oh_n = (h + 2 * pad - kh) // stride + 1
    ow_n = (w + 2 * pad - kw) // stride + 1
    dxf = dx.reshape(nb, h * w * c)
    dxf[:] = 0.0
    seg = kw * c
    row = 0
    for b in range(nb):
        dxb = dxf[b]
        for oh in range(oh_n):
            for ow in range(ow_n):
                w0 = ow * stride - pad
                lo = max(0, -w0) * c
                hi = min(kw, w - w0) * c
                crow = dcols[row]
                for i in range(kh):
                    ih = oh * stride - pad + i
                    if ih < 0 or ih >= h or hi <= lo:
                        continue
                    src = crow[i * seg + lo:i * seg + hi]
                    dst = dxb[(ih * w + w0) * c + lo:(ih * w + w0) * c + hi]
                    for t in range(hi - lo):
                        dst[t] += src[t]
                row += 1
    return dx


@njit(cache=True)
def conv2d_forward(x, wb, kh, kw, stride, pad, cols, out, chunk=1):
    """Convolution (cross-correlation, as in every DL framework) plus bias: ``out = im2col(x) @ wb``.

    Parameters
    ----------
    x : (B, H, W, C) float32 or float64, C-contiguous
    wb : (KH*KW*C + 1, F) same dtype, C-contiguous: weights in (kh, kw, c) row order, bias last
    kh, kw, stride, pad : int (zero padding ``pad`` on all four sides)
    cols : (B*OH*OW, KH*KW*C + 1) scratch, overwritten with the im2col matrix; keep it
        for :func:`conv2d_backward_params`
    out : (B, OH, OW, F) overwritten
    chunk : int
        Samples per im2col + GEMM round; pick it so a chunk of ``cols`` fits in L2 cache,
        and the GEMM reads what im2col just wrote from cache (the result does not depend on it).

    Returns
    -------
    out : the same array
    """
    nb = x.shape[0]
    rows = cols.shape[0] // nb
    om = out.reshape(cols.shape[0], wb.shape[1])
    for s in range(0, nb, chunk):
        e = min(nb, s + chunk)
        c = cols[s * rows:e * rows]
        im2col(x[s:e], kh, kw, stride, pad, c)
        np.dot(c, wb, om[s * rows:e * rows])
    return out


@njit(cache=True)
def conv2d_backward_params(cols, dout, dwb):
    """Weight and bias gradients in one GEMM: ``dwb = cols.T @ dout`` (the last row is the bias gradient).

    Parameters
    ----------
    cols : (B*OH*OW, KH*KW*C + 1) the im2col matrix of the forward pass
    dout : (B, OH, OW, F) C-contiguous
    dwb : (KH*KW*C + 1, F) overwritten
    """
    np.dot(cols.T, dout.reshape(cols.shape[0], dwb.shape[1]), dwb)


@njit(cache=True)
def conv2d_backward_input(w, dout, kh, kw, stride, pad, dcols, dx):
    """Input gradient: ``dcols = dout @ w.T``, folded back with :func:`col2im`, a chunk of samples at a time.

    Parameters
    ----------
    w : (KH*KW*C, F) C-contiguous: ``wb`` without its bias row (``wb[:-1]``)
    dout : (B, OH, OW, F) C-contiguous
    kh, kw, stride, pad : int
    dcols : (chunk*OH*OW, KH*KW*C) scratch, overwritten; its length sets the chunk of samples
        per GEMM + col2im round (small enough to stay in L2 cache)
    dx : (B, H, W, C) overwritten

    Returns
    -------
    dx : the same array
    """
    nb, oh, ow, f = dout.shape
    rows = oh * ow
    chunk = max(1, dcols.shape[0] // rows)
    dm = dout.reshape(nb * rows, f)
    for s in range(0, nb, chunk):
        e = min(nb, s + chunk)
        c = dcols[:(e - s) * rows]
        np.dot(dm[s * rows:e * rows], w.T, c)
        col2im(c, kh, kw, stride, pad, dx[s:e])
    return dx
