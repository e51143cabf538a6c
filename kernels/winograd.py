"""Winograd F(2x2, 3x3) convolution of stride-1 3x3 kernels on channels-last arrays, forward beside backward."""
# Lavin & Gray 2016: each 4x4 input tile d and 3x3 filter g give the 2x2 output tile
# Y = A^T [(G g G^T) * (B^T d B)] A, so a layer is 16 independent GEMMs V[xi] (tiles, C) @
# U[xi] (C, F) between the transforms, 2.25x fewer multiplications than im2col's GEMM.  The
# backward is the adjoint of each step: dM = A dY A^T, dU[xi] = V[xi]^T dM[xi] (then
# dw = G^T dU G) and dV[xi] = dM[xi] U[xi]^T folded back as B dV B^T, so forward and backward
# share the transforms and the tile layout.  B^T and A^T hold only 0 and +-1: their products are
# written out as adds.  The parameter layout ``wb`` is :mod:`psgd.kernels.conv`'s: (9*C + 1, F),
# weights in (kh, kw, c) row order, then the bias.
import numpy as np
from numba import njit

G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def winograd_shapes(h, w, pad):
    """(tiles per sample, (Hp, Wp)): the 2x2 output tiles of an (H, W) input's 3x3 convolution and
    the zero-padded input that holds each tile's whole 4x4 window (tiles may overhang the edge)."""
    th, tw = -(-(h + 2 * pad - 2) // 2), -(-(w + 2 * pad - 2) // 2)
    return th * tw, (2 * th + 2, 2 * tw + 2)


def winograd_plane(tiles, n):
    """Row length of a (16, plane) tile buffer for ``tiles`` tiles of ``n`` channels: tiles*n
    plus 32 elements, so the 16 rows a transform reads or writes together do not start a
    power of two apart (where they would share L1 cache sets and thrash)."""
    return tiles * n + 32


@njit(cache=True)
def _slab(buf, xi, rows, n):
    """Element ``xi`` of every tile as a C-contiguous (rows, n) matrix: the GEMM operand."""
    return buf[xi][:rows * n].reshape(rows, n)


@njit(cache=True)
def _filter_transform(w, g, u):
    """u[i*n + j] = (g w g^T)[i, j] over (C, F): (r, r, C, F) -> (n*n, C, F) for the (n, r)
    filter transform ``g`` (:data:`G` here, ``psgd.kernels.winograd5.G`` for 5x5 kernels)."""
    n, r = g.shape
    for i in range(n):
        for j in range(n):
            ui = u[i * n + j]
            ui[:] = 0.0
            for k in range(r):
                for l in range(r):
                    coef = g[i, k] * g[j, l]
                    if coef != 0.0:
                        ui += coef * w[k, l]


@njit(cache=True)
def _filter_adjoint(du, g, dw):
    """dw[k, l] = (g^T du g)[k, l] over (C, F): (n*n, C, F) -> (r, r, C, F)."""
    n, r = g.shape
    for k in range(r):
        for l in range(r):
            d = dw[k, l]
            d[:] = 0.0
            for i in range(n):
                for j in range(n):
                    coef = g[i, k] * g[j, l]
                    if coef != 0.0:
                        d += coef * du[i * n + j]


@njit(cache=True)
def _bias_grad(dout, db):
    """db = the sum of ``dout`` (B, OH, OW, F) over all but its last axis."""
    f = dout.shape[3]
    db[:] = 0.0
    d2 = dout.reshape(dout.size // f, f)
    for i in range(d2.shape[0]):
        db += d2[i]


@njit(cache=True)
def _pad_into(x, pad, xp):
    """xp[:, pad:pad+H, pad:pad+W] = x, zeros elsewhere, each row of ``xp`` split into its even
    columns then its odd ones (so a tile's columns 2tx..2tx+3 are two runs of contiguous tiles)."""
    nb, h, w, c = x.shape
    hp, wp = xp.shape[1], xp.shape[2]
    half = wp // 2 * c
    xf, pf = x.reshape(nb * h, w * c), xp.reshape(nb * hp, wp * c)
    for b in range(nb):
        for i in range(hp):
            dst = pf[b * hp + i]
            dst[:] = 0.0
            if i < pad or i >= pad + h:
                continue
            src = xf[b * h + i - pad]
            for j in range(w):
                col = j + pad
                d, s = (col % 2) * half + col // 2 * c, j * c
                for q in range(c):
                    dst[d + q] = src[s + q]


@njit(cache=True)
def _crop_from(xp, pad, dx):
    """dx = xp[:, pad:pad+H, pad:pad+W] from :func:`_pad_into`'s split rows (its adjoint)."""
    nb, h, w, c = dx.shape
    hp, wp = xp.shape[1], xp.shape[2]
    half = wp // 2 * c
    pf, df = xp.reshape(nb * hp, wp * c), dx.reshape(nb * h, w * c)
    for b in range(nb):
        for i in range(h):
            src, dst = pf[b * hp + i + pad], df[b * h + i]
            for j in range(w):
                col = j + pad
                s, d = (col % 2) * half + col // 2 * c, j * c
                for q in range(c):
                    dst[d + q] = src[s + q]


# The row helpers take their coefficients (small integers, exact in float32) as float32, so a
# float32 row is combined in float32 rather than converted to float64 and back.
@njit(cache=True)
def _lin(a, ca, b, cb, out):
    """out = ca*a + cb*b (1-D)."""
    ca, cb = np.float32(ca), np.float32(cb)
    for q in range(out.shape[0]):
        out[q] = ca * a[q] + cb * b[q]


@njit(cache=True)
def _lin3(a, ca, b, cb, d, cd, out):
    """out = ca*a + cb*b + cd*d (1-D)."""
    ca, cb, cd = np.float32(ca), np.float32(cb), np.float32(cd)
    for q in range(out.shape[0]):
        out[q] = ca * a[q] + cb * b[q] + cd * d[q]


@njit(cache=True)
def _add_to(a, ca, out):
    """out += ca*a (1-D)."""
    ca = np.float32(ca)
    for q in range(out.shape[0]):
        out[q] += ca * a[q]


@njit(cache=True)
def _input_transform(xp, th, tw, v, tmp):
    """v[i*4 + j, t*C + q] = (B^T d B)[i, j] of tile t's 4 x 4 window d of ``xp``, channel q
    (B^T rows: [1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]).

    xp : (n, Hp, Wp, C) rows split as :func:`_pad_into` writes them; v : (16, plane),
    plane >= n*th*tw*C; tmp : (4, Wp*C) scratch
    """
    nb, hp, wp, c = xp.shape
    half, n = wp // 2 * c, tw * c
    pf = xp.reshape(nb * hp, wp * c)
    t = 0
    for b in range(nb):
        for ty in range(th):
            r = b * hp + 2 * ty
            x0, x1, x2, x3 = pf[r], pf[r + 1], pf[r + 2], pf[r + 3]
            _lin(x0, 1.0, x2, -1.0, tmp[0])    # B^T d on the four rows, all tiles at once
            _lin(x1, 1.0, x2, 1.0, tmp[1])
            _lin(x2, 1.0, x1, -1.0, tmp[2])
            _lin(x1, 1.0, x3, -1.0, tmp[3])
            o = t * c
            for i in range(4):                  # (...) B: columns 2tx, 2tx+2 are even[tx], even[tx+1]
                s = tmp[i]
                e0, e1, o0, o1 = s[:n], s[c:c + n], s[half:half + n], s[half + c:half + c + n]
                _lin(e0, 1.0, e1, -1.0, v[4 * i][o:o + n])
                _lin(o0, 1.0, e1, 1.0, v[4 * i + 1][o:o + n])
                _lin(e1, 1.0, o0, -1.0, v[4 * i + 2][o:o + n])
                _lin(o0, 1.0, o1, -1.0, v[4 * i + 3][o:o + n])
            t += tw


@njit(cache=True)
def _input_adjoint(dv, th, tw, dxp, tmp):
    """dxp = the sum over tiles of B dV B^T placed at each tile's 4 x 4 window, rows split as
    :func:`_pad_into` writes them (the adjoint of :func:`_input_transform`; overlapping windows
    add).  ``dxp`` is overwritten.

    dv : (16, plane) as :func:`_input_transform`'s ``v``; tmp : (17, tw*C) scratch
    """
    nb, hp, wp, c = dxp.shape
    half, n = wp // 2 * c, tw * c
    pf = dxp.reshape(nb * hp, wp * c)
    pf[:] = 0.0
    t = 0
    for b in range(nb):
        for ty in range(th):
            o = t * c
            for j in range(4):                  # B dV on the row of tiles: tmp[4k + j]
                d0, d1, d2, d3 = dv[j][o:o + n], dv[4 + j][o:o + n], dv[8 + j][o:o + n], dv[12 + j][o:o + n]
                tmp[j, :] = d0
                _lin3(d1, 1.0, d2, -1.0, d3, 1.0, tmp[4 + j])
                _lin3(d0, -1.0, d1, 1.0, d2, 1.0, tmp[8 + j])
                _lin(d3, -1.0, d3, 0.0, tmp[12 + j])
            for k in range(4):                  # (...) B^T, added onto row 2ty + k's columns
                row = pf[b * hp + 2 * ty + k]
                t0, t1, t2, t3 = tmp[4 * k], tmp[4 * k + 1], tmp[4 * k + 2], tmp[4 * k + 3]
                _add_to(t0, 1.0, row[:n])                                     # column 2tx
                _lin3(t1, 1.0, t2, -1.0, t3, 1.0, tmp[16])
                _add_to(tmp[16], 1.0, row[half:half + n])                     # 2tx + 1
                _lin3(t0, -1.0, t1, 1.0, t2, 1.0, tmp[16])
                _add_to(tmp[16], 1.0, row[c:c + n])                           # 2tx + 2
                _add_to(t3, -1.0, row[half + c:half + c + n])                 # 2tx + 3
            t += tw


@njit(cache=True)
def _output_transform(mm, bias, th, tw, out, tmp):
    """out tile = A^T M A + bias (A^T rows: [1, 1, 1, 0], [0, 1, -1, -1]), cut at the output's edge.

    mm : (16, plane), element xi of tile t, filter q at mm[xi, t*F + q]; out : (n, OH, OW, F);
    tmp : (2, 4, tw*F) scratch
    """
    nb, oh, ow, f = out.shape
    n = tw * f
    of = out.reshape(nb * oh, ow * f)
    t = 0
    for b in range(nb):
        for ty in range(th):
            o = t * f
            for j in range(4):                  # A^T M on the row of tiles
                m0, m1, m2, m3 = mm[j][o:o + n], mm[4 + j][o:o + n], mm[8 + j][o:o + n], mm[12 + j][o:o + n]
                _lin3(m0, 1.0, m1, 1.0, m2, 1.0, tmp[0, j])
                _lin3(m1, 1.0, m2, -1.0, m3, -1.0, tmp[1, j])
            for i in range(min(2, oh - 2 * ty)):   # (...) A per tile, plus the bias
                row = of[b * oh + 2 * ty + i]
                e0, e1, e2, e3 = tmp[i, 0], tmp[i, 1], tmp[i, 2], tmp[i, 3]
                for tx in range(tw):
                    p, s = 2 * tx * f, tx * f
                    a0, a1, a2, a3 = e0[s:s + f], e1[s:s + f], e2[s:s + f], e3[s:s + f]
                    y0 = row[p:p + f]
                    for q in range(f):
                        y0[q] = a0[q] + a1[q] + a2[q] + bias[q]
                    if 2 * tx + 1 < ow:
                        y1 = row[p + f:p + 2 * f]
                        for q in range(f):
                            y1[q] = a1[q] - a2[q] - a3[q] + bias[q]
            t += tw


@njit(cache=True)
def _split_dy_rows(df, row0, oh, ow, f, n, ty, tmp):
    """tmp[0], tmp[1] = output-gradient rows 2ty and 2ty + 1 of the sample whose rows start at
    ``row0`` of ``df`` (B*OH, OW*F), split into even then odd columns (zeros past the bottom
    edge), each half ``n`` = tw*F long: what the output transforms' adjoints combine."""
    for i in range(2):
        y, dst = df[row0 + min(2 * ty + i, oh - 1)], tmp[i]
        live = 1.0 if 2 * ty + i < oh else 0.0
        for x in range(ow):
            d, s = (x % 2) * n + x // 2 * f, x * f
            for q in range(f):
                dst[d + q] = live * y[s + q]


@njit(cache=True)
def _output_adjoint(dout, th, tw, dm, tmp):
    """dm[k*4 + l, t*F + q] = (A dY A^T)[k, l], dY tile t's 2 x 2 block of ``dout`` (zeros past
    the edge): the adjoint of :func:`_output_transform`.

    dm : (16, plane) as its ``mm``; tmp : (4, 2*tw*F) scratch
    """
    nb, oh, ow, f = dout.shape
    n = tw * f
    df = dout.reshape(nb * oh, ow * f)
    tmp[:2] = 0.0                               # (past the right edge dY stays 0)
    t = 0
    for b in range(nb):
        for ty in range(th):
            _split_dy_rows(df, b * oh, oh, ow, f, n, ty, tmp)
            y0, y1 = tmp[0], tmp[1]
            _lin(y0, 1.0, y1, 1.0, tmp[2])      # A dY: rows y0, y0 + y1, y0 - y1, -y1
            _lin(y0, 1.0, y1, -1.0, tmp[3])
            o = t * f
            for k in range(4):                  # (...) A^T: columns 2tx, 2tx + 1 are the halves
                s, sign = (y0, 1.0) if k == 0 else (tmp[k + 1], 1.0) if k < 3 else (y1, -1.0)
                e, od = s[:n], s[n:]
                _lin(e, sign, od, 0.0, dm[4 * k][o:o + n])
                _lin(e, sign, od, sign, dm[4 * k + 1][o:o + n])
                _lin(e, sign, od, -sign, dm[4 * k + 2][o:o + n])
                _lin(e, 0.0, od, -sign, dm[4 * k + 3][o:o + n])
            t += tw


@njit(cache=True)
def winograd_forward(x, wb, pad, u, xp, vbuf, mbuf, out, chunk):
    """Stride-1 3x3 convolution (cross-correlation) plus bias by Winograd F(2x2, 3x3), ``chunk``
    samples at a time; :func:`psgd.kernels.conv.conv2d_forward`'s result up to rounding.

    Parameters
    ----------
    x : (B, H, W, C) float32 or float64, C-contiguous
    wb : (9*C + 1, F) same dtype: weights in (kh, kw, c) row order, bias last
    pad : int, zero padding on all four sides
    u : (16, C, F) overwritten with the transformed filters (read by :func:`winograd_backward`)
    xp : (chunk, Hp, Wp, C) scratch, Hp and Wp from :func:`winograd_shapes`
    vbuf : (16, plane) scratch for the transformed input tiles, plane from
        :func:`winograd_plane` for chunk*tiles tiles of C channels (tiles from :func:`winograd_shapes`)
    mbuf : (16, plane) scratch for the GEMMs' products, plane for chunk*tiles tiles of F filters
    out : (B, OH, OW, F) overwritten
    chunk : int, samples per round (the result does not depend on it)

    Returns
    -------
    out : the same array
    """
    nb, h, w, c = x.shape
    f = out.shape[3]
    th, tw = -(-out.shape[1] // 2), -(-out.shape[2] // 2)
    _filter_transform(wb[:9 * c].reshape(3, 3, c, f), G, u)
    bias = wb[9 * c]
    tmp_in, tmp_out = np.empty((4, xp.shape[2] * c), x.dtype), np.empty((2, 4, tw * f), x.dtype)
    for s in range(0, nb, chunk):
        e = min(nb, s + chunk)
        rows = (e - s) * th * tw
        _pad_into(x[s:e], pad, xp[:e - s])
        _input_transform(xp[:e - s], th, tw, vbuf, tmp_in)
        for xi in range(16):
            np.dot(_slab(vbuf, xi, rows, c), u[xi], _slab(mbuf, xi, rows, f))
        _output_transform(mbuf, bias, th, tw, out[s:e], tmp_out)
    return out


@njit(cache=True)
def winograd_backward(x, dout, pad, u, xp, vbuf, mbuf, du, dwb, dx, chunk):
    """Gradients of :func:`winograd_forward` (its adjoint, step by step), ``chunk`` samples at a
    time: V again from ``x``, dM = A dY A^T, dU += V^T dM and dV = dM U^T per tile element, then
    dw = G^T dU G, the bias gradient the sum of ``dout``, and dx = B dV B^T folded onto the input.

    Parameters
    ----------
    x, pad, xp, vbuf, mbuf, chunk : as for :func:`winograd_forward`
    dout : (B, OH, OW, F) C-contiguous
    u : (16, C, F) the forward's transformed filters (the weights must not have changed)
    du : (16, C, F) scratch
    dwb : (9*C + 1, F) overwritten
    dx : (B, H, W, C) overwritten, or an empty (0, 0, 0, 0) array when the input gradient is
        not needed (the first layer)

    Returns
    -------
    dwb : the same array
    """
    nb, h, w, c = x.shape
    f = dout.shape[3]
    th, tw = -(-dout.shape[1] // 2), -(-dout.shape[2] // 2)
    part = np.empty((c, f), x.dtype)
    tmp_in, tmp_dx = np.empty((4, xp.shape[2] * c), x.dtype), np.empty((17, tw * c), x.dtype)
    tmp_out = np.empty((4, 2 * tw * f), x.dtype)
    for s in range(0, nb, chunk):
        e = min(nb, s + chunk)
        rows = (e - s) * th * tw
        _pad_into(x[s:e], pad, xp[:e - s])
        _input_transform(xp[:e - s], th, tw, vbuf, tmp_in)
        _output_adjoint(dout[s:e], th, tw, mbuf, tmp_out)
        for xi in range(16):
            v, dm = _slab(vbuf, xi, rows, c), _slab(mbuf, xi, rows, f)
            if s == 0:
                np.dot(v.T, dm, du[xi])
            else:
                np.dot(v.T, dm, part)
                du[xi] += part
            if dx.shape[0] != 0:    # dV over V, whose element xi no later GEMM reads
                np.dot(dm, u[xi].T, v)
        if dx.shape[0] != 0:
            _input_adjoint(vbuf, th, tw, xp[:e - s], tmp_dx)
            _crop_from(xp[:e - s], pad, dx[s:e])
    _filter_adjoint(du, G, dwb[:9 * c].reshape(3, 3, c, f))
    _bias_grad(dout, dwb[9 * c])
    return dwb
