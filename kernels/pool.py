"""Pooling kernels on channels-last (B, H, W, C) arrays: max (backward routes to the arg-max),
average, and global average, forward beside backward."""
from numba import njit


def pool_out_size(n, k, stride):
    """Output length of a pooled axis of length ``n`` (no padding)."""
    return (n - k) // stride + 1


@njit(cache=True)
def maxpool2d_forward(x, k, stride, out, argmax):
    """Max pooling over ``k x k`` windows with the given stride, no padding.

    Parameters
    ----------
    x : (B, H, W, C) float32 or float64
    k, stride : int
    out : (B, OH, OW, C) same dtype, overwritten; ``OH = (H - k) // stride + 1``
    argmax : (B, OH, OW, C) int32, overwritten with the flat index ``ih * W + iw``
        of the winning input (the first maximum in row-major window order)

    Returns
    -------
    out : the same array
    """
    nb, h, w, c = x.shape
    oh_n, ow_n = out.shape[1], out.shape[2]
    for b in range(nb):
        for oh in range(oh_n):
            h0 = oh * stride
            for ow in range(ow_n):
                w0 = ow * stride
                for ch in range(c):
                    out[b, oh, ow, ch] = x[b, h0, w0, ch]
                    argmax[b, oh, ow, ch] = h0 * w + w0
                for i in range(k):
                    for j in range(k):
                        if i == 0 and j == 0:
                            continue
                        ih = h0 + i
                        iw = w0 + j
                        flat = ih * w + iw
                        for ch in range(c):
                            v = x[b, ih, iw, ch]  # selects, not branches: data-dependent maxima mispredict
                            cur = out[b, oh, ow, ch]
                            better = v > cur
                            out[b, oh, ow, ch] = v if better else cur
                            argmax[b, oh, ow, ch] = flat if better else argmax[b, oh, ow, ch]
    return out


@njit(cache=True)
def maxpool2d_backward(dout, argmax, k, stride, dx):
    """Route each output gradient to the input that won the forward max.

    Parameters
    ----------
    dout : (B, OH, OW, C) gradient w.r.t. the pooled output
    argmax : (B, OH, OW, C) int32 from :func:`maxpool2d_forward`
    k, stride : int, as in the forward pass
    dx : (B, H, W, C) overwritten (zero except at arg-max positions; overlapping
        windows accumulate)

    Returns
    -------
    dx : the same array
    """
    nb, h, w, c = dx.shape
    oh_n, ow_n = dout.shape[1], dout.shape[2]
    if k == stride and oh_n * k == h and ow_n * k == w:
        # the windows tile dx exactly: write every element once, no zeroing pass
        for b in range(nb):
            for ih in range(h):
                oh = ih // k
                for iw in range(w):
                    ow = iw // k
                    flat = ih * w + iw
                    for ch in range(c):
                        g = dout[b, oh, ow, ch]  # unconditional load: a select, not a branch
                        dx[b, ih, iw, ch] = g if argmax[b, oh, ow, ch] == flat else 0.0
        return dx
    dx[:] = 0.0
    for b in range(nb):
        for oh in range(oh_n):
            for ow in range(ow_n):
                for ch in range(c):
                    idx = argmax[b, oh, ow, ch]
                    dx[b, idx // w, idx % w, ch] += dout[b, oh, ow, ch]
    return dx


@njit(cache=True)
def avgpool2d_forward(x, k, stride, out):
    """Average pooling over ``k x k`` windows with the given stride, no padding.

    Parameters
    ----------
    x : (B, H, W, C) float32 or float64
    k, stride : int
    out : (B, OH, OW, C) same dtype, overwritten; ``OH = (H - k) // stride + 1``

    Returns
    -------
    out : the same array
    """
    nb, h, w, c = x.shape
    oh_n, ow_n = out.shape[1], out.shape[2]
    inv = 1.0 / (k * k)
    for b in range(nb):
        for oh in range(oh_n):
            for ow in range(ow_n):
                o = out[b, oh, ow]
                for ch in range(c):
                    o[ch] = 0.0
                for i in range(k):
                    for j in range(k):
                        src = x[b, oh * stride + i, ow * stride + j]
                        for ch in range(c):
                            o[ch] += src[ch]
                for ch in range(c):
                    o[ch] *= inv
    return out


@njit(cache=True)
def avgpool2d_backward(dout, k, stride, dx):
    """Spread each output gradient evenly over its ``k x k`` window (overlaps accumulate).

    Parameters
    ----------
    dout : (B, OH, OW, C) gradient w.r.t. the pooled output
    k, stride : int, as in the forward pass
    dx : (B, H, W, C) overwritten (zero where no window reaches)

    Returns
    -------
    dx : the same array
    """
    nb, oh_n, ow_n, c = dout.shape
    inv = 1.0 / (k * k)
    dx[:] = 0.0
    for b in range(nb):
        for oh in range(oh_n):
            for ow in range(ow_n):
                g = dout[b, oh, ow]
                for i in range(k):
                    for j in range(k):
                        dst = dx[b, oh * stride + i, ow * stride + j]
                        for ch in range(c):
                            dst[ch] += g[ch] * inv
    return dx


@njit(cache=True)
def global_avgpool_forward(x, out):
    """Mean over all pixels of each channel: (B, H, W, C) -> (B, C).

    Parameters
    ----------
    x : (B, H, W, C) float32 or float64
    out : (B, C) same dtype, overwritten

    Returns
    -------
    out : the same array
    """
    nb, h, w, c = x.shape
    xf = x.reshape(nb, h * w, c)
    inv = 1.0 / (h * w)
    for b in range(nb):
        o = out[b]
        for ch in range(c):
            o[ch] = 0.0
        for p in range(h * w):
            src = xf[b, p]
            for ch in range(c):
                o[ch] += src[ch]
        for ch in range(c):
            o[ch] *= inv
    return out


@njit(cache=True)
def global_avgpool_backward(dout, dx):
    """Each pixel of a channel gets ``1 / (H*W)`` of that channel's output gradient.

    Parameters
    ----------
    dout : (B, C)
    dx : (B, H, W, C) overwritten

    Returns
    -------
    dx : the same array
    """
    nb, h, w, c = dx.shape
    dxf = dx.reshape(nb, h * w, c)
    inv = 1.0 / (h * w)
    for b in range(nb):
        g = dout[b]
        for p in range(h * w):
            dst = dxf[b, p]
            for ch in range(c):
                dst[ch] = g[ch] * inv
    return dx
