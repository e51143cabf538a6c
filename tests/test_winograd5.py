"""Winograd F(2x2, 5x5) convolution against the im2col kernel, a numpy loop, float64 finite
differences and .py_func, with padding and odd sizes (tiles over the edge), chunks that do not
divide the batch and the batch's V kept from forward to backward or not; and Conv2D's choice."""
import numpy as np
import pytest

from psgd.kernels import winograd5 as wg
from psgd.kernels.conv import conv2d_backward, conv2d_forward, conv_out_size
from psgd.kernels.winograd import winograd_plane
from psgd.nn.layers import Conv2D
from test_kernels import numeric_grad, rand
from test_kernels_cnn import ref_conv_rect

# float32: each output sums 36 products whose transforms scale by up to 5 (B^T) and 2/3 (G), so
# it rounds differently from im2col's direct sum; measured up to 3e-6 of the output's largest
# magnitude on these sizes and 7e-6 on lenet's 14x14x16 -> 32 layer (weight gradient).  1e-4
# leaves more than 10x headroom; a wrong coefficient, index or sign gives errors of 1e-2 or more.
F32_TOL = 1e-4
SIZES = [  # B, H, W, C, F, pad, chunk, keep (the whole batch's V from forward to backward)
    (3, 6, 6, 2, 3, 2, 2, False),   # even output, two rounds of 2 + 1
    (3, 7, 9, 3, 2, 2, 2, True),    # odd H and W: the last tiles hang over the edge
    (2, 9, 8, 4, 3, 0, 1, False),   # no padding, odd output height
    (2, 5, 7, 2, 4, 1, 5, True),    # padding 1, chunk larger than the batch
    (1, 5, 5, 1, 1, 0, 1, False),   # one output pixel
]


def buffers(nb, h, w, c, f, pad, chunk, keep, dtype):
    tiles, padded = wg.winograd5_shapes(h, w, pad)
    n = min(nb, chunk)
    return (np.empty((36, c, f), dtype), np.empty((n, *padded, c), dtype),
            np.empty((36, winograd_plane((nb if keep else n) * tiles, c)), dtype),
            np.empty((36, winograd_plane(n * tiles, f)), dtype))


def run(x, wb, dout, pad, chunk, keep, need_dx=True, fwd=wg.winograd5_forward, bwd=wg.winograd5_backward):
    nb, h, w, c = x.shape
    f = wb.shape[1]
    u, xp, vbuf, mbuf = buffers(nb, h, w, c, f, pad, chunk, keep, x.dtype)
    out = fwd(x, wb, pad, u, xp, vbuf, mbuf, np.full((nb, *dout.shape[1:3], f), np.nan, x.dtype), chunk)
    dwb = np.full_like(wb, np.nan)
    dx = np.full_like(x, np.nan) if need_dx else np.empty((0, 0, 0, 0), x.dtype)
    bwd(x, dout, pad, u, xp, vbuf, mbuf, np.empty_like(u), dwb, dx, chunk)
    return out, dwb, dx


def im2col(x, wb, dout, pad):
    nb, h, w, c = x.shape
    oh, ow = dout.shape[1:3]
    cols = np.empty((nb * oh * ow, wb.shape[0]), x.dtype)
    out = conv2d_forward(x, wb, 5, 5, 1, pad, cols, np.empty((nb, oh, ow, wb.shape[1]), x.dtype), nb)
    dwb, dx = np.empty_like(wb), np.empty_like(x)
    conv2d_backward(x, wb, dout, 5, 5, 1, pad, cols, dwb, dx, nb)
    return out, dwb, dx


def case(size, dtype, seed=0):
    nb, h, w, c, f, pad, chunk, keep = size
    rng = np.random.default_rng(seed)
    x, wb = rand(rng, nb, h, w, c, dtype=dtype), rand(rng, 25 * c + 1, f, dtype=dtype)
    dout = rand(rng, nb, conv_out_size(h, 5, 1, pad), conv_out_size(w, 5, 1, pad), f, dtype=dtype)
    return x, wb, dout, pad, chunk, keep


def assert_close(got, want, tol):
    assert np.all(np.isfinite(got))
    err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
    assert err <= tol, err


@pytest.mark.parametrize("size", SIZES)
def test_winograd5_matches_im2col_and_numpy_in_float32(size):
    x, wb, dout, pad, chunk, keep = case(size, np.float32)
    got = run(x, wb, dout, pad, chunk, keep)
    ref = im2col(x, wb, dout, pad)
    c, f = x.shape[3], wb.shape[1]
    direct = ref_conv_rect(x.astype(np.float64), wb[:-1].reshape(5, 5, c, f).astype(np.float64), wb[-1], 1, pad)
    assert_close(got[0], direct, F32_TOL)
    for g, r in zip(got, ref):
        assert_close(g, r.astype(np.float64), F32_TOL)


@pytest.mark.parametrize("size", SIZES)
def test_winograd5_backward_matches_finite_differences_float64(size):
    x, wb, dout, pad, chunk, keep = case(size, np.float64, seed=1)
    out, dwb, dx = run(x, wb, dout, pad, chunk, keep)
    c, f = x.shape[3], wb.shape[1]
    w, b = wb[:-1].reshape(5, 5, c, f).copy(), wb[-1].copy()
    np.testing.assert_allclose(out, ref_conv_rect(x, w, b, 1, pad), rtol=1e-11, atol=1e-11)
    loss = lambda: float((ref_conv_rect(x, w, b, 1, pad) * dout).sum())  # noqa: E731
    np.testing.assert_allclose(dwb[:-1].reshape(w.shape), numeric_grad(loss, w), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dwb[-1], numeric_grad(loss, b), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("keep", [False, True])
def test_winograd5_without_input_gradient_gives_the_same_weight_gradient(keep):
    x, wb, dout, pad, chunk, _ = case(SIZES[1], np.float64, seed=2)
    _, dwb, _ = run(x, wb, dout, pad, chunk, keep)
    _, dwb_first, dx = run(x, wb, dout, pad, chunk, keep, need_dx=False)
    assert dx.shape == (0, 0, 0, 0)
    np.testing.assert_array_equal(dwb_first, dwb)


def test_winograd5_compiled_matches_py_func():
    x, wb, dout, pad, chunk, keep = case(SIZES[1], np.float64, seed=3)
    compiled = run(x, wb, dout, pad, chunk, keep)
    python = run(x, wb, dout, pad, chunk, keep, fwd=wg.winograd5_forward.py_func,
                 bwd=wg.winograd5_backward.py_func)
    for a, b in zip(compiled, python):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-13)


def test_conv_layer_picks_winograd5_by_kernel_stride_and_channels():
    assert Conv2D((14, 14, 16), 32, k=5, pad=2).winograd                  # lenet's second layer
    assert not Conv2D((28, 28, 1), 16, k=5, pad=2).winograd               # its first: im2col
    assert not Conv2D((14, 14, 16), 32, k=5, pad=2, stride=2).winograd
    assert not Conv2D((14, 14, 16), 32, k=(5, 3), pad=2).winograd
    with pytest.raises(ValueError, match="Winograd needs a 3x3 or 5x5 kernel at stride 1"):
        Conv2D((16, 16, 32), 8, k=5, stride=2, winograd=True)


def test_conv_layer_winograd5_and_im2col_agree_in_float32():
    rng = np.random.default_rng(4)
    x, dy = rand(rng, 5, 7, 9, 16, dtype=np.float32), rand(rng, 5, 7, 9, 6, dtype=np.float32)
    bias, results = rand(rng, 6, dtype=np.float32), []
    for winograd in (True, False):
        layer = Conv2D((7, 9, 16), 6, k=5, pad=2, winograd=winograd)
        shape = layer.param_shapes()[0][1]
        wb, dwb = np.empty(shape, np.float32), np.empty(shape, np.float32)
        layer.bind({"wb": wb}, {"wb": dwb})
        layer.init_params(np.random.default_rng(0))
        wb[-1] = bias
        for _ in range(2):      # a second step reuses every buffer
            out = layer.forward(x).copy()
            dx = layer.backward(dy).copy()
        results.append((out, dwb.copy(), dx))
    for a, b in zip(*results):
        assert_close(a, b.astype(np.float64), F32_TOL)
