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
def conv2d_forward(x, wb, kh, kw, stride, pad, cols, out, chunk):
    """Convolution (cross-correlation, as in every DL framework) plus bias: ``out = im2col(x) @ wb``,
    ``chunk`` samples at a time.

    Parameters
    ----------
    x : (B, H, W, C) float32 or float64, C-contiguous
    wb : (KH*KW*C + 1, F) same dtype, C-contiguous: weights in (kh, kw, c) row order, bias last
    kh, kw, stride, pad : int (zero padding ``pad`` on all four sides)
    cols : (chunk*OH*OW, KH*KW*C + 1) scratch that every chunk reuses (small enough to stay
        in L2 cache, so the GEMM reads what im2col just wrote from there), or
        (B*OH*OW, KH*KW*C + 1): the whole batch's im2col matrix, kept for
        :func:`conv2d_backward`; overwritten either way
    out : (B, OH, OW, F) overwritten
    chunk : int, samples per im2col + GEMM round (the result does not depend on it)

    Returns
    -------
    out : the same array
    """
    nb, oh, ow, f = out.shape
    rows = oh * ow
    whole = cols.shape[0] >= nb * rows
    om = out.reshape(nb * rows, f)
    for s in range(0, nb, chunk):
        e = min(nb, s + chunk)
        c = cols[s * rows:e * rows] if whole else cols[:(e - s) * rows]
        im2col(x[s:e], kh, kw, stride, pad, c)
        np.dot(c, wb, om[s * rows:e * rows])
    return out


@njit(cache=True)
def conv2d_backward(x, wb, dout, kh, kw, stride, pad, cols, dwb, dx, chunk):
    """Gradients of :func:`conv2d_forward`, ``chunk`` samples at a time: im2col again (unless
    ``cols`` holds the whole batch's matrix), ``dwb += cols.T @ dout`` (its last row is the bias
    gradient), then ``dcols = dout @ w.T`` folded back with :func:`col2im`.

    Parameters
    ----------
    x : (B, H, W, C) the forward input, C-contiguous
    wb : (KH*KW*C + 1, F) C-contiguous, the forward's weights and bias
    dout : (B, OH, OW, F) C-contiguous
    kh, kw, stride, pad : int
    cols : the ``cols`` of :func:`conv2d_forward`; also scratch for each chunk's ``dcols``,
        so a whole-batch matrix is used up
    dwb : (KH*KW*C + 1, F) overwritten
    dx : (B, H, W, C) overwritten, or an empty (0, 0, 0, 0) array when the input gradient
        is not needed (the first layer)
    chunk : int, samples per round

    Returns
    -------
    dwb : the same array

    Notes
    -----
    Recomputing im2col into an L2-sized chunk costs less than writing and rereading the
    whole batch's im2col matrix, and keeps only a chunk of it in memory.
    """
    nb, oh, ow, f = dout.shape
    rows = oh * ow
    k = wb.shape[0] - 1
    whole = cols.shape[0] >= nb * rows
    dm = dout.reshape(nb * rows, f)
    w = wb[:k]
    part = np.empty_like(dwb)
    flat = cols.reshape(cols.size)
    for s in range(0, nb, chunk):
        e = min(nb, s + chunk)
        d = dm[s * rows:e * rows]
        if whole:
            c = cols[s * rows:e * rows]
        else:
            c = cols[:(e - s) * rows]
            im2col(x[s:e], kh, kw, stride, pad, c)
        if s == 0:
            np.dot(c.T, d, dwb)
        else:
            np.dot(c.T, d, part)
            dwb += part
        if dx.shape[0] != 0:  # dcols in cols' first rows, which no later chunk reads
            dc = flat[:(e - s) * rows * k].reshape((e - s) * rows, k)
            np.dot(d, w.T, dc)
            col2im(dc, kh, kw, stride, pad, dx[s:e])
    return dwb
