"""Winograd F(2x2, 5x5) convolution of stride-1 5x5 kernels on channels-last arrays, forward beside backward."""
# The 5x5 sibling of :mod:`psgd.kernels.winograd` (same steps, buffers and adjoints): a 6x6
# input tile d and a 5x5 filter g give the 2x2 output tile Y = A^T [(G g G^T) * (B^T d B)] A,
# so a layer is 36 GEMMs V[xi] (tiles, C) @ U[xi] (C, F), 2.78x fewer multiplications than
# im2col's.  Cook-Toom points 0, 1, -1, 2, -2 and infinity (integer B^T and A^T; docs/results/kernels.md
# compares their float32 rounding with that of 0, +-1, +-1/2):
#   B^T rows [4, 0, -5, 0, 1, 0], [0, 4, 4, -1, -1, 0], [0, -4, 4, 1, -1, 0],
#            [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1];
#   A^T rows [1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 1];  G as below.
# The products by B^T, B, A^T and A are written out as row loops over all tiles of a row.
import numpy as np
from numba import njit

from psgd.kernels.winograd import (_add_to, _bias_grad, _crop_from, _filter_adjoint, _filter_transform,
                                   _lin, _lin3, _pad_into, _slab, _split_dy_rows)

G = np.array([[1 / 4, 0, 0, 0, 0],
              [1 / 6, 1 / 6, 1 / 6, 1 / 6, 1 / 6],
              [1 / 6, -1 / 6, 1 / 6, -1 / 6, 1 / 6],
              [1 / 24, 2 / 24, 4 / 24, 8 / 24, 16 / 24],
              [1 / 24, -2 / 24, 4 / 24, -8 / 24, 16 / 24],
              [0, 0, 0, 0, 1.0]])


def winograd5_shapes(h, w, pad):
    """(tiles per sample, (Hp, Wp)): the 2x2 output tiles of an (H, W) input's 5x5 convolution and
    the zero-padded input that holds each tile's whole 6x6 window (tiles may overhang the edge)."""
    th, tw = -(-(h + 2 * pad - 4) // 2), -(-(w + 2 * pad - 4) // 2)
    return th * tw, (2 * th + 4, 2 * tw + 4)


@njit(cache=True)
def _lin4(a, ca, b, cb, d, cd, e, ce, out):
    """out = ca*a + cb*b + cd*d + ce*e (1-D), coefficients as float32 (see winograd._lin)."""
    ca, cb, cd, ce = np.float32(ca), np.float32(cb), np.float32(cd), np.float32(ce)
    for q in range(out.shape[0]):
        out[q] = ca * a[q] + cb * b[q] + cd * d[q] + ce * e[q]


@njit(cache=True)
def _lin5(a, ca, b, cb, d, cd, e, ce, g, cg, out):
    """out = ca*a + cb*b + cd*d + ce*e + cg*g (1-D), coefficients as float32."""
    ca, cb, cd, ce, cg = np.float32(ca), np.float32(cb), np.float32(cd), np.float32(ce), np.float32(cg)
    for q in range(out.shape[0]):
        out[q] = ca * a[q] + cb * b[q] + cd * d[q] + ce * e[q] + cg * g[q]


@njit(cache=True)
def _acc5(a, ca, b, cb, d, cd, e, ce, g, cg, out):
    """out += ca*a + cb*b + cd*d + ce*e + cg*g (1-D), coefficients as float32."""
    ca, cb, cd, ce, cg = np.float32(ca), np.float32(cb), np.float32(cd), np.float32(ce), np.float32(cg)
    for q in range(out.shape[0]):
        out[q] += ca * a[q] + cb * b[q] + cd * d[q] + ce * e[q] + cg * g[q]


@njit(cache=True)
def _bt(x0, x1, x2, x3, x4, x5, y0, y1, y2, y3, y4, y5):
    """y_i = (B^T x)_i for six equally long rows x0..x5."""
    _lin3(x0, 4.0, x2, -5.0, x4, 1.0, y0)
    _lin4(x1, 4.0, x2, 4.0, x3, -1.0, x4, -1.0, y1)
    _lin4(x1, -4.0, x2, 4.0, x3, 1.0, x4, -1.0, y2)
    _lin4(x1, -2.0, x2, -1.0, x3, 2.0, x4, 1.0, y3)
    _lin4(x1, 2.0, x2, -1.0, x3, -2.0, x4, 1.0, y4)
    _lin3(x1, 4.0, x3, -5.0, x5, 1.0, y5)


@njit(cache=True)
def _input_transform(xp, th, tw, v, tmp, t0):
    """v[i*6 + j, (t0 + t)*C + q] = (B^T d B)[i, j] of tile t's 6 x 6 window d of ``xp``, channel q.

    xp : (n, Hp, Wp, C) rows split as :func:`psgd.kernels.winograd._pad_into` writes them;
    v : (36, plane), plane >= (t0 + n*th*tw)*C; tmp : (6, Wp*C) scratch; t0 : int, the first tile's slot
    """
    nb, hp, wp, c = xp.shape
    half, n = wp // 2 * c, tw * c
    pf = xp.reshape(nb * hp, wp * c)
    t = t0
    for b in range(nb):
        for ty in range(th):
            r = b * hp + 2 * ty
            _bt(pf[r], pf[r + 1], pf[r + 2], pf[r + 3], pf[r + 4], pf[r + 5],
                tmp[0], tmp[1], tmp[2], tmp[3], tmp[4], tmp[5])                    # B^T d
            o = t * c
            for i in range(6):      # (...) B: column 2tx + 2k is even[tx + k], 2tx + 2k + 1 odd[tx + k]
                s = tmp[i]
                e0, e1, e2 = s[:n], s[c:c + n], s[2 * c:2 * c + n]
                o0, o1, o2 = s[half:half + n], s[half + c:half + c + n], s[half + 2 * c:half + 2 * c + n]
                _bt(e0, o0, e1, o1, e2, o2, v[6 * i][o:o + n], v[6 * i + 1][o:o + n],
                    v[6 * i + 2][o:o + n], v[6 * i + 3][o:o + n], v[6 * i + 4][o:o + n],
                    v[6 * i + 5][o:o + n])
            t += tw


@njit(cache=True)
def _b(d0, d1, d2, d3, d4, d5, out, o, stride):
    """out[o + k*stride] = (B d)_k for six equally long rows d0..d5 (B = (B^T)^T)."""
    _lin(d0, 4.0, d0, 0.0, out[o])
    _lin5(d1, 4.0, d2, -4.0, d3, -2.0, d4, 2.0, d5, 4.0, out[o + stride])
    _lin5(d0, -5.0, d1, 4.0, d2, 4.0, d3, -1.0, d4, -1.0, out[o + 2 * stride])
    _lin5(d1, -1.0, d2, 1.0, d3, 2.0, d4, -2.0, d5, -5.0, out[o + 3 * stride])
    _lin5(d0, 1.0, d1, -1.0, d2, -1.0, d3, 1.0, d4, 1.0, out[o + 4 * stride])
    _lin(d5, 1.0, d5, 0.0, out[o + 5 * stride])


@njit(cache=True)
def _input_adjoint(dv, th, tw, dxp, tmp, t0):
    """dxp = the sum over tiles of B dV B^T placed at each tile's 6 x 6 window, rows split as
    :func:`psgd.kernels.winograd._pad_into` writes them (the adjoint of :func:`_input_transform`;
    overlapping windows add).  ``dxp`` is overwritten.

    dv : (36, plane) as :func:`_input_transform`'s ``v``, tiles from slot t0 on; tmp : (36, tw*C) scratch
    """
    nb, hp, wp, c = dxp.shape
    half, n = wp // 2 * c, tw * c
    pf = dxp.reshape(nb * hp, wp * c)
    pf[:] = 0.0
    t = t0
    for b in range(nb):
        for ty in range(th):
            o = t * c
            for j in range(6):      # B dV on the row of tiles: tmp[6k + j]
                _b(dv[j][o:o + n], dv[6 + j][o:o + n], dv[12 + j][o:o + n], dv[18 + j][o:o + n],
                   dv[24 + j][o:o + n], dv[30 + j][o:o + n], tmp, j, 6)
            for k in range(6):      # (...) B^T added onto row 2ty + k: column 2tx + l is
                row = pf[b * hp + 2 * ty + k]   # even[tx + l/2] or odd[tx + (l-1)/2]
                d0, d1, d2, d3, d4, d5 = (tmp[6 * k], tmp[6 * k + 1], tmp[6 * k + 2], tmp[6 * k + 3],
                                          tmp[6 * k + 4], tmp[6 * k + 5])
                _add_to(d0, 4.0, row[:n])
                _acc5(d1, 4.0, d2, -4.0, d3, -2.0, d4, 2.0, d5, 4.0, row[half:half + n])
                _acc5(d0, -5.0, d1, 4.0, d2, 4.0, d3, -1.0, d4, -1.0, row[c:c + n])
                _acc5(d1, -1.0, d2, 1.0, d3, 2.0, d4, -2.0, d5, -5.0, row[half + c:half + c + n])
                _acc5(d0, 1.0, d1, -1.0, d2, -1.0, d3, 1.0, d4, 1.0, row[2 * c:2 * c + n])
                _add_to(d5, 1.0, row[half + 2 * c:half + 2 * c + n])
            t += tw


@njit(cache=True)
def _output_transform(mm, bias, th, tw, out, tmp):
    """out tile = A^T M A + bias, cut at the output's edge.

    mm : (36, plane), element xi of tile t, filter q at mm[xi, t*F + q]; out : (n, OH, OW, F);
    tmp : (2, 6, tw*F) scratch
    """
    nb, oh, ow, f = out.shape
    n, two = tw * f, np.float32(2.0)
    of = out.reshape(nb * oh, ow * f)
    t = 0
    for b in range(nb):
        for ty in range(th):
            o = t * f
            for j in range(6):      # A^T M on the row of tiles
                m0, m1, m2 = mm[j][o:o + n], mm[6 + j][o:o + n], mm[12 + j][o:o + n]
                m3, m4, m5 = mm[18 + j][o:o + n], mm[24 + j][o:o + n], mm[30 + j][o:o + n]
                _lin5(m0, 1.0, m1, 1.0, m2, 1.0, m3, 1.0, m4, 1.0, tmp[0, j])
                _lin5(m1, 1.0, m2, -1.0, m3, 2.0, m4, -2.0, m5, 1.0, tmp[1, j])
            for i in range(min(2, oh - 2 * ty)):   # (...) A per tile, plus the bias
                row = of[b * oh + 2 * ty + i]
                e0, e1, e2, e3, e4, e5 = tmp[i, 0], tmp[i, 1], tmp[i, 2], tmp[i, 3], tmp[i, 4], tmp[i, 5]
                for tx in range(tw):
                    p, s = 2 * tx * f, tx * f
                    a0, a1, a2, a3, a4, a5 = (e0[s:s + f], e1[s:s + f], e2[s:s + f], e3[s:s + f],
                                              e4[s:s + f], e5[s:s + f])
                    y0 = row[p:p + f]
                    for q in range(f):
                        y0[q] = a0[q] + a1[q] + a2[q] + a3[q] + a4[q] + bias[q]
                    if 2 * tx + 1 < ow:
                        y1 = row[p + f:p + 2 * f]
                        for q in range(f):
                            y1[q] = a1[q] - a2[q] + two * (a3[q] - a4[q]) + a5[q] + bias[q]
            t += tw


@njit(cache=True)
def _a(y0, y1, z0, z1, z2, z3, z4, z5):
    """z_k = (A y)_k for two equally long rows y0, y1 (A rows [1, 0], [1, 1], [1, -1], [1, 2],
    [1, -2], [0, 1])."""
    _lin(y0, 1.0, y1, 0.0, z0)
    _lin(y0, 1.0, y1, 1.0, z1)
    _lin(y0, 1.0, y1, -1.0, z2)
    _lin(y0, 1.0, y1, 2.0, z3)
    _lin(y0, 1.0, y1, -2.0, z4)
    _lin(y0, 0.0, y1, 1.0, z5)


@njit(cache=True)
def _output_adjoint(dout, th, tw, dm, tmp):
    """dm[k*6 + l, t*F + q] = (A dY A^T)[k, l], dY tile t's 2 x 2 block of ``dout`` (zeros past
    the edge): the adjoint of :func:`_output_transform`.

    dm : (36, plane) as its ``mm``; tmp : (8, 2*tw*F) scratch
    """
    nb, oh, ow, f = dout.shape
    n = tw * f
    df = dout.reshape(nb * oh, ow * f)
    tmp[:2] = 0.0                               # (past the right edge dY stays 0)
    t = 0
    for b in range(nb):
        for ty in range(th):
            _split_dy_rows(df, b * oh, oh, ow, f, n, ty, tmp)
            _a(tmp[0], tmp[1], tmp[2], tmp[3], tmp[4], tmp[5], tmp[6], tmp[7])  # A dY
            o = t * f
            for k in range(6):                  # (...) A^T: columns 2tx, 2tx + 1 are the halves
                s = tmp[2 + k]
                r = 6 * k
                _a(s[:n], s[n:], dm[r][o:o + n], dm[r + 1][o:o + n], dm[r + 2][o:o + n],
                   dm[r + 3][o:o + n], dm[r + 4][o:o + n], dm[r + 5][o:o + n])
            t += tw


@njit(cache=True)
def winograd5_forward(x, wb, pad, u, xp, vbuf, mbuf, out, chunk):
    """Stride-1 5x5 convolution (cross-correlation) plus bias by Winograd F(2x2, 5x5), ``chunk``
    samples at a time; :func:`psgd.kernels.conv.conv2d_forward`'s result up to rounding.

    Parameters
    ----------
    x : (B, H, W, C) float32 or float64, C-contiguous
    wb : (25*C + 1, F) same dtype: weights in (kh, kw, c) row order, bias last
    pad : int, zero padding on all four sides
    u : (36, C, F) overwritten with the transformed filters (read by :func:`winograd5_backward`)
    xp : (chunk, Hp, Wp, C) scratch, Hp and Wp from :func:`winograd5_shapes`
    vbuf : (36, plane) scratch for the transformed input tiles, plane from
        :func:`psgd.kernels.winograd.winograd_plane` for chunk*tiles tiles of C channels, or for
        the whole batch's B*tiles: then V is kept for :func:`winograd5_backward`
    mbuf : (36, plane) scratch for the GEMMs' products, plane for chunk*tiles tiles of F filters
    out : (B, OH, OW, F) overwritten
    chunk : int, samples per round (the result does not depend on it)

    Returns
    -------
    out : the same array
    """
    nb, h, w, c = x.shape
    f = out.shape[3]
    th, tw = -(-out.shape[1] // 2), -(-out.shape[2] // 2)
    _filter_transform(wb[:25 * c].reshape(5, 5, c, f), G, u)
    bias = wb[25 * c]
    tmp_in, tmp_out = np.empty((6, xp.shape[2] * c), x.dtype), np.empty((2, 6, tw * f), x.dtype)
    keep = vbuf.shape[1] >= nb * th * tw * c
    for s in range(0, nb, chunk):
        e = min(nb, s + chunk)
        rows, t0 = (e - s) * th * tw, s * th * tw if keep else 0
        _pad_into(x[s:e], pad, xp[:e - s])
        _input_transform(xp[:e - s], th, tw, vbuf, tmp_in, t0)
        for xi in range(36):
            np.dot(vbuf[xi][t0 * c:(t0 + rows) * c].reshape(rows, c), u[xi], _slab(mbuf, xi, rows, f))
        _output_transform(mbuf, bias, th, tw, out[s:e], tmp_out)
    return out


@njit(cache=True)
def winograd5_backward(x, dout, pad, u, xp, vbuf, mbuf, du, dwb, dx, chunk):
    """Gradients of :func:`winograd5_forward` (its adjoint, step by step), ``chunk`` samples at a
    time, as :func:`psgd.kernels.winograd.winograd_backward` does for 3x3 kernels.

    Parameters
    ----------
    x, pad, xp, vbuf, mbuf, chunk : as for :func:`winograd5_forward`; a whole batch's ``vbuf``
        holds the forward's V (so the transform is not done again) and is used up
    dout : (B, OH, OW, F) C-contiguous
    u : (36, C, F) the forward's transformed filters (the weights must not have changed)
    du : (36, C, F) scratch
    dwb : (25*C + 1, F) overwritten
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
    tmp_in, tmp_dx = np.empty((6, xp.shape[2] * c), x.dtype), np.empty((36, tw * c), x.dtype)
    tmp_out = np.empty((8, 2 * tw * f), x.dtype)
    keep = vbuf.shape[1] >= nb * th * tw * c
    for s in range(0, nb, chunk):
        e = min(nb, s + chunk)
        rows, t0 = (e - s) * th * tw, s * th * tw if keep else 0
        if not keep:
            _pad_into(x[s:e], pad, xp[:e - s])
            _input_transform(xp[:e - s], th, tw, vbuf, tmp_in, 0)
        _output_adjoint(dout[s:e], th, tw, mbuf, tmp_out)
        for xi in range(36):
            v, dm = vbuf[xi][t0 * c:(t0 + rows) * c].reshape(rows, c), _slab(mbuf, xi, rows, f)
            if s == 0:
                np.dot(v.T, dm, du[xi])
            else:
                np.dot(v.T, dm, part)
                du[xi] += part
            if dx.shape[0] != 0:    # dV over V, whose element xi no later GEMM reads
                np.dot(dm, u[xi].T, v)
        if dx.shape[0] != 0:
            _input_adjoint(vbuf, th, tw, xp[:e - s], tmp_dx, t0)
            _crop_from(xp[:e - s], pad, dx[s:e])
    _filter_adjoint(du, G, dwb[:25 * c].reshape(5, 5, c, f))
    _bias_grad(dout, dwb[25 * c])
    return dwb
