"""Winograd F(2x2, 3x3) convolution against the im2col kernel, a numpy loop, float64 finite
differences and .py_func, with padding and odd sizes (tiles over the edge) and chunks that
do not divide the batch; and the Conv2D layer's choice between the two."""
import numpy as np
import pytest

from psgd.kernels import winograd as wg
from psgd.kernels.conv import conv2d_backward, conv2d_forward, conv_out_size
from psgd.nn.layers import Conv2D
from test_kernels import numeric_grad, rand
from test_kernels_cnn import ref_conv_rect

# float32: Winograd adds up to 16 transformed terms per product and scales by 1/2 and 1/4, so
# it rounds differently from im2col's direct sum; measured 1-6e-7 of the output's largest
# magnitude on these sizes (a few ulps).  2e-5 of it leaves 30x headroom, and a wrong index
# or sign anywhere gives errors of order 1.
F32_TOL = 2e-5
SIZES = [  # B, H, W, C, F, pad, chunk
    (3, 6, 6, 2, 3, 1, 2),    # even output, two rounds of 2 + 1
    (3, 7, 5, 3, 2, 1, 2),    # odd H and W: the last tiles hang over the edge
    (2, 9, 8, 4, 3, 0, 1),    # no padding, odd output height
    (2, 5, 7, 2, 4, 2, 5),    # padding 2, chunk larger than the batch
    (1, 3, 3, 1, 1, 0, 1),    # one output pixel
]


def buffers(nb, h, w, c, f, pad, chunk, dtype):
    tiles, padded = wg.winograd_shapes(h, w, pad)
    n = min(nb, chunk)
    return (np.empty((16, c, f), dtype), np.empty((n, *padded, c), dtype),
            np.empty((16, wg.winograd_plane(n * tiles, c)), dtype),
            np.empty((16, wg.winograd_plane(n * tiles, f)), dtype))


def run(x, wb, dout, pad, chunk, need_dx=True):
    nb, h, w, c = x.shape
    f = wb.shape[1]
    u, xp, vbuf, mbuf = buffers(nb, h, w, c, f, pad, chunk, x.dtype)
    oh, ow = conv_out_size(h, 3, 1, pad), conv_out_size(w, 3, 1, pad)
    out = wg.winograd_forward(x, wb, pad, u, xp, vbuf, mbuf, np.full((nb, oh, ow, f), np.nan, x.dtype), chunk)
    dwb = np.full_like(wb, np.nan)
    dx = np.full_like(x, np.nan) if need_dx else np.empty((0, 0, 0, 0), x.dtype)
    wg.winograd_backward(x, dout, pad, u, xp, vbuf, mbuf, np.empty_like(u), dwb, dx, chunk)
    return out, dwb, dx


def im2col(x, wb, dout, pad):
    nb, h, w, c = x.shape
    oh, ow = conv_out_size(h, 3, 1, pad), conv_out_size(w, 3, 1, pad)
    cols = np.empty((nb * oh * ow, wb.shape[0]), x.dtype)
    out = conv2d_forward(x, wb, 3, 3, 1, pad, cols, np.empty((nb, oh, ow, wb.shape[1]), x.dtype), nb)
    dwb, dx = np.empty_like(wb), np.empty_like(x)
    conv2d_backward(x, wb, dout, 3, 3, 1, pad, cols, dwb, dx, nb)
    return out, dwb, dx


def case(size, dtype, seed=0):
    nb, h, w, c, f, pad, chunk = size
    rng = np.random.default_rng(seed)
    x, wb = rand(rng, nb, h, w, c, dtype=dtype), rand(rng, 9 * c + 1, f, dtype=dtype)
    dout = rand(rng, nb, conv_out_size(h, 3, 1, pad), conv_out_size(w, 3, 1, pad), f, dtype=dtype)
    return x, wb, dout, pad, chunk


def assert_close(got, want, tol):
    assert np.all(np.isfinite(got))
    err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert err <= tol, err


@pytest.mark.parametrize("size", SIZES)
def test_winograd_matches_im2col_and_numpy_in_float32(size):
    x, wb, dout, pad, chunk = case(size, np.float32)
    got = run(x, wb, dout, pad, chunk)
    ref = im2col(x, wb, dout, pad)
    c, f = x.shape[3], wb.shape[1]
    w64 = wb[:-1].reshape(3, 3, c, f).astype(np.float64)
    direct = ref_conv_rect(x.astype(np.float64), w64, wb[-1], 1, pad)
    assert_close(got[0], direct, F32_TOL)
    for g, r in zip(got, ref):
        assert_close(g, r.astype(np.float64), F32_TOL)


@pytest.mark.parametrize("size", SIZES)
def test_winograd_backward_matches_finite_differences_float64(size):
    x, wb, dout, pad, chunk = case(size, np.float64, seed=1)
    out, dwb, dx = run(x, wb, dout, pad, chunk)
    c, f = x.shape[3], wb.shape[1]
    w, b = wb[:-1].reshape(3, 3, c, f).copy(), wb[-1].copy()
    np.testing.assert_allclose(out, ref_conv_rect(x, w, b, 1, pad), rtol=1e-12, atol=1e-12)
    loss = lambda: float((ref_conv_rect(x, w, b, 1, pad) * dout).sum())  # noqa: E731
    np.testing.assert_allclose(dwb[:-1].reshape(w.shape), numeric_grad(loss, w), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dwb[-1], numeric_grad(loss, b), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-7)


def test_winograd_without_input_gradient_gives_the_same_weight_gradient():
    x, wb, dout, pad, chunk = case(SIZES[1], np.float64, seed=2)
    _, dwb, _ = run(x, wb, dout, pad, chunk)
    _, dwb_first, dx = run(x, wb, dout, pad, chunk, need_dx=False)
    assert dx.shape == (0, 0, 0, 0)
    np.testing.assert_array_equal(dwb_first, dwb)


def test_winograd_compiled_matches_py_func():
    x, wb, dout, pad, chunk = case(SIZES[1], np.float64, seed=3)
    nb, h, w, c = x.shape
    f = wb.shape[1]
    oh, ow = dout.shape[1:3]
    outs = []
    for fwd, bwd in ((wg.winograd_forward, wg.winograd_backward),
                     (wg.winograd_forward.py_func, wg.winograd_backward.py_func)):
        u, xp, vbuf, mbuf = buffers(nb, h, w, c, f, pad, chunk, x.dtype)
        out = fwd(x, wb, pad, u, xp, vbuf, mbuf, np.empty((nb, oh, ow, f)), chunk)
        dwb, dx = np.empty_like(wb), np.empty_like(x)
        bwd(x, dout, pad, u, xp, vbuf, mbuf, np.empty_like(u), dwb, dx, chunk)
        outs.append((out, dwb, dx))
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_conv_layer_picks_winograd_by_kernel_stride_and_channels():
    assert Conv2D((8, 8, 32), 8, k=3, pad=1).winograd
    assert not Conv2D((16, 16, 16), 8, k=3, pad=1).winograd    # few channels: im2col
    assert not Conv2D((16, 16, 32), 8, k=3, stride=2).winograd
    assert Conv2D((8, 8, 3), 8, k=3, pad=1, winograd=True).winograd
    with pytest.raises(ValueError, match="Winograd needs a 3x3 or 5x5 kernel at stride 1"):
        Conv2D((16, 16, 32), 8, k=3, stride=2, winograd=True)


def test_conv_layer_winograd_and_im2col_agree_in_float32():
    rng = np.random.default_rng(4)
    x, dy = rand(rng, 5, 7, 9, 16, dtype=np.float32), rand(rng, 5, 7, 9, 6, dtype=np.float32)
    bias, results = rand(rng, 6, dtype=np.float32), []
    for winograd in (True, False):
        layer = Conv2D((7, 9, 16), 6, k=3, pad=1, winograd=winograd)
        shape = layer.param_shapes()[0][1]
        wb, dwb = np.empty(shape, np.float32), np.empty(shape, np.float32)
        layer.bind({"wb": wb}, {"wb": dwb})
        layer.init_params(np.random.default_rng(0))
        wb[-1] = bias
        out = layer.forward(x).copy()
        dx = layer.backward(dy).copy()
        results.append((out, dwb.copy(), dx))
    for a, b in zip(*results):
        assert_close(a, b.astype(np.float64), F32_TOL)
