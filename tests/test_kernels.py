"""Every kernel against a plain numpy reference, central finite differences in float64, and its own .py_func."""
import numpy as np
import pytest

from psgd.kernels.activation import relu_backward, relu_forward
from psgd.kernels.conv import col2im, conv2d_backward, conv2d_forward, conv_out_size, im2col
from psgd.kernels.dense import dense_backward_input, dense_backward_params, dense_forward
from psgd.kernels.finite import add_into, finite
from psgd.kernels.loss import labels_in_range, softmax_cross_entropy
from psgd.kernels.pool import maxpool2d_backward, maxpool2d_forward, pool_out_size

# ---------------------------------------------------------------- plain numpy references


def ref_dense(x, w, b):
    return x @ w + b


def ref_conv(x, w, b, stride, pad):
    """Direct (B, H, W, C) x (KH, KW, C, F) cross-correlation by summing shifted slices."""
    kh, kw, _, f = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh = (xp.shape[1] - kh) // stride + 1
    ow = (xp.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, f), x.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride, :]
            out += patch @ w[i, j]
    return out + b


def ref_pool(x, k, stride):
    n, h, w, c = x.shape
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    out = np.full((n, oh, ow, c), -np.inf, x.dtype)
    for i in range(k):
        for j in range(k):
            out = np.maximum(out, x[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride, :])
    return out


def ref_softmax_ce(logits, labels):
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    n = len(labels)
    loss = -logp[np.arange(n), labels].mean()
    d = np.exp(logp)
    d[np.arange(n), labels] -= 1.0
    return loss, d / n, int((logits.argmax(axis=1) == labels).sum())


def numeric_grad(f, arr, eps=1e-6):
    """Central differences of the scalar ``f()`` w.r.t. every entry of ``arr`` (float64, in place)."""
    g = np.zeros_like(arr)
    flat, gflat = arr.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return g


def rand(rng, *shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- dense


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_forward_matches_numpy(dtype):
    rng = np.random.default_rng(0)
    x, w, b = rand(rng, 5, 7, dtype=dtype), rand(rng, 7, 3, dtype=dtype), rand(rng, 3, dtype=dtype)
    out = dense_forward(x, w, b, np.empty((5, 3), dtype))
    assert out.dtype == dtype
    np.testing.assert_allclose(out, ref_dense(x, w, b), rtol=1e-5, atol=1e-5)


def test_dense_backward_matches_finite_differences_float64():
    rng = np.random.default_rng(1)
    x, w, b, r = rand(rng, 4, 6), rand(rng, 6, 3), rand(rng, 3), rand(rng, 4, 3)
    loss = lambda: float((ref_dense(x, w, b) * r).sum())  # noqa: E731
    dw, db, dx = np.empty_like(w), np.empty_like(b), np.empty_like(x)
    dense_backward_params(x, r, dw, db)
    dense_backward_input(w, r, dx)
    np.testing.assert_allclose(dw, numeric_grad(loss, w), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(db, numeric_grad(loss, b), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-7)


def test_dense_backward_overwrites_stale_gradients():
    rng = np.random.default_rng(2)
    x, r = rand(rng, 4, 6), rand(rng, 4, 3)
    dw, db = np.full((6, 3), np.nan), np.full(3, np.nan)
    dense_backward_params(x, r, dw, db)
    np.testing.assert_allclose(dw, x.T @ r)
    np.testing.assert_allclose(db, r.sum(axis=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_relu_forward_matches_numpy(dtype):
    rng = np.random.default_rng(3)
    x, w, b = rand(rng, 6, 7, dtype=dtype), rand(rng, 7, 5, dtype=dtype), rand(rng, 5, dtype=dtype)
    out = dense_forward(x, w, b, np.empty((6, 5), dtype), True)
    ref = np.maximum(ref_dense(x, w, b), 0)
    assert 0 < (ref > 0).sum() < ref.size  # the ReLU cuts some, not all
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_dense_relu_backward_matches_finite_differences_float64():
    rng = np.random.default_rng(4)
    x, w, b, r = rand(rng, 5, 6), rand(rng, 6, 4), rand(rng, 4), rand(rng, 5, 4)
    pre = ref_dense(x, w, b)
    assert np.abs(pre).min() > 1e-3  # no pre-activation at the kink
    loss = lambda: float((np.maximum(ref_dense(x, w, b), 0) * r).sum())  # noqa: E731
    out = dense_forward(x, w, b, np.empty((5, 4)), True)
    dw, db, dx, d = np.full_like(w, np.nan), np.full_like(b, np.nan), np.empty_like(x), r.copy()
    dense_backward_params(x, d, dw, db, out)
    np.testing.assert_array_equal(d, np.where(out > 0, r, 0.0))  # dout masked in place
    dense_backward_input(w, d, dx)
    np.testing.assert_allclose(dw, numeric_grad(loss, w), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(db, numeric_grad(loss, b), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- conv

CONV_CASES = [  # (B, H, W, C, F, k, stride, pad)
    (2, 6, 5, 3, 4, 3, 1, 1),
    (1, 7, 7, 2, 3, 3, 2, 0),
    (2, 5, 5, 1, 2, 5, 1, 2),
    (1, 6, 6, 2, 2, 2, 2, 1),
]


def pack(w, b):
    """The kernels' (KH*KW*C + 1, F) parameter matrix: weights in (kh, kw, c) row order, bias last."""
    return np.concatenate([w.reshape(-1, w.shape[-1]), b[None, :]])


def conv_buffers(case, dtype=np.float64, chunk=1, whole=False):
    """(cols scratch for ``chunk`` samples, or the whole batch's, out) of a conv case."""
    nb, h, w_, c, f, k, s, p = case
    oh, ow = conv_out_size(h, k, s, p), conv_out_size(w_, k, s, p)
    n = nb if whole else min(chunk, nb)
    return np.empty((n * oh * ow, k * k * c + 1), dtype), np.empty((nb, oh, ow, f), dtype)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("chunk,whole", [(1, False), (2, False), (64, False), (1, True)])
def test_conv_forward_matches_numpy(case, dtype, chunk, whole):
    nb, h, w_, c, f, k, s, p = case
    rng = np.random.default_rng(3)
    x, w, b = rand(rng, nb, h, w_, c, dtype=dtype), rand(rng, k, k, c, f, dtype=dtype), rand(rng, f, dtype=dtype)
    cols, out = conv_buffers(case, dtype, chunk, whole)
    out = conv2d_forward(x, pack(w, b), k, k, s, p, cols, out, chunk)
    np.testing.assert_allclose(out, ref_conv(x, w, b, s, p), rtol=1e-5, atol=1e-5)
    assert np.all(cols[:, -1] == 1.0)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("chunk,whole", [(1, False), (64, False), (1, True)])
def test_conv_backward_matches_finite_differences_float64(case, chunk, whole):
    nb, h, w_, c, f, k, s, p = case
    rng = np.random.default_rng(4)
    x, w, b = rand(rng, nb, h, w_, c), rand(rng, k, k, c, f), rand(rng, f)
    cols, out = conv_buffers(case, chunk=chunk, whole=whole)
    r = rand(rng, *out.shape)
    loss = lambda: float((ref_conv(x, w, b, s, p) * r).sum())  # noqa: E731
    wb = pack(w, b)
    conv2d_forward(x, wb, k, k, s, p, cols, out, chunk)
    dwb, dx = np.full_like(wb, np.nan), np.full_like(x, np.nan)
    conv2d_backward(x, wb, r, k, k, s, p, cols, dwb, dx, chunk)
    np.testing.assert_allclose(dwb[:-1].reshape(w.shape), numeric_grad(loss, w), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dwb[-1], numeric_grad(loss, b), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-7)
    dwb2 = np.full_like(wb, np.nan)  # without the input gradient: the same parameter gradients
    conv2d_forward(x, wb, k, k, s, p, cols, out, chunk)
    conv2d_backward(x, wb, r, k, k, s, p, cols, dwb2, np.empty((0, 0, 0, 0)), chunk)
    np.testing.assert_array_equal(dwb2, dwb)


def test_col2im_is_the_adjoint_of_im2col():
    rng = np.random.default_rng(5)
    x = rand(rng, 2, 6, 5, 3)
    cols = im2col(x, 3, 3, 2, 1, np.empty((2 * 3 * 3, 27 + 1)))
    d = rand(rng, 2 * 3 * 3, 27)
    # <im2col(x), d> == <x, col2im(d)> for every x, d
    assert np.isclose((cols[:, :-1] * d).sum(), (x * col2im(d, 3, 3, 2, 1, np.empty_like(x))).sum())


# ---------------------------------------------------------------- pool


@pytest.mark.parametrize("k,stride", [(2, 2), (3, 2), (2, 1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maxpool_forward_matches_numpy(k, stride, dtype):
    rng = np.random.default_rng(6)
    x = rand(rng, 2, 7, 6, 3, dtype=dtype)
    oh, ow = pool_out_size(7, k, stride), pool_out_size(6, k, stride)
    out = np.empty((2, oh, ow, 3), dtype)
    maxpool2d_forward(x, k, stride, out, np.empty(out.shape, np.int32))
    np.testing.assert_array_equal(out, ref_pool(x, k, stride))


@pytest.mark.parametrize("k,stride", [(2, 2), (3, 2), (2, 1), (3, 3)])
@pytest.mark.parametrize("h,w", [(7, 6), (6, 6), (6, 12)])  # (6, *) with k == stride: windows tile x
def test_maxpool_backward_matches_finite_differences_float64(k, stride, h, w):
    rng = np.random.default_rng(7)
    x = rng.permutation(2 * h * w * 3).reshape(2, h, w, 3).astype(np.float64)  # distinct values: no ties
    oh, ow = pool_out_size(h, k, stride), pool_out_size(w, k, stride)
    r = rand(rng, 2, oh, ow, 3)
    out, am = np.empty((2, oh, ow, 3)), np.empty((2, oh, ow, 3), np.int32)
    maxpool2d_forward(x, k, stride, out, am)
    assert np.all(np.isfinite(maxpool2d_backward(r, am, k, stride, np.full_like(x, np.nan))))
    dx = maxpool2d_backward(r, am, k, stride, np.full_like(x, np.nan))
    loss = lambda: float((ref_pool(x, k, stride) * r).sum())  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(loss, x, eps=1e-3), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- relu


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_forward_and_backward_match_numpy(dtype):
    rng = np.random.default_rng(8)
    x, r = rand(rng, 50, dtype=dtype), rand(rng, 50, dtype=dtype)
    out = relu_forward(x, np.empty_like(x))
    np.testing.assert_array_equal(out, np.maximum(x, 0))
    np.testing.assert_array_equal(relu_backward(out, r, np.empty_like(r)), r * (x > 0))


def test_relu_backward_matches_finite_differences_float64():
    rng = np.random.default_rng(9)
    x = rand(rng, 40)
    x[np.abs(x) < 1e-3] = 0.5  # keep away from the kink
    r = rand(rng, 40)
    out = relu_forward(x, np.empty_like(x))
    loss = lambda: float((np.maximum(x, 0) * r).sum())  # noqa: E731
    np.testing.assert_allclose(relu_backward(out, r, np.empty_like(r)), numeric_grad(loss, x), atol=1e-7)


# ---------------------------------------------------------------- softmax cross-entropy


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_cross_entropy_matches_numpy(dtype):
    rng = np.random.default_rng(10)
    logits, labels = rand(rng, 8, 5, dtype=dtype) * 3, rng.integers(0, 5, 8)
    d = np.empty_like(logits)
    loss, correct = softmax_cross_entropy(logits, labels, d)
    ref_loss, ref_d, ref_correct = ref_softmax_ce(logits.astype(np.float64), labels)
    assert np.isclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(d, ref_d, rtol=1e-4, atol=1e-6)
    assert correct == ref_correct


def test_softmax_cross_entropy_gradient_matches_finite_differences_float64():
    rng = np.random.default_rng(11)
    logits, labels = rand(rng, 6, 4), rng.integers(0, 4, 6)
    d = np.empty_like(logits)
    softmax_cross_entropy(logits, labels, d)
    loss = lambda: float(ref_softmax_ce(logits, labels)[0])  # noqa: E731
    np.testing.assert_allclose(d, numeric_grad(loss, logits), rtol=1e-6, atol=1e-8)


def test_labels_in_range_matches_numpy():
    rng = np.random.default_rng(13)
    for _ in range(50):
        y = rng.integers(-2, 7, rng.integers(1, 6))
        assert labels_in_range(y, 5) == bool(((y >= 0) & (y < 5)).all())
    assert labels_in_range(np.zeros(0, np.int64), 3)


def test_softmax_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1e4, 0.0, -1e4], [0.0, 1e4, 1e4 - 1.0]])
    d = np.empty_like(logits)
    loss, correct = softmax_cross_entropy(logits, np.array([0, 2]), d)
    assert np.isfinite(loss) and np.all(np.isfinite(d))
    assert np.isclose(loss, (0.0 + (1.0 + np.log1p(np.exp(-1.0)))) / 2)
    assert correct == 1


# ---------------------------------------------------------------- compiled == .py_func


def _pyfunc_cases():
    rng = np.random.default_rng(12)
    x, wb = rand(rng, 2, 5, 5, 2), rand(rng, 19, 3)
    cols = np.empty((2 * 3 * 3, 19))
    xd, wd, bd, rd = rand(rng, 3, 4), rand(rng, 4, 2), rand(rng, 2), rand(rng, 3, 2)
    dout = rand(rng, 2, 3, 3, 3)
    cols_f = im2col(x, 3, 3, 2, 1, np.empty((2 * 3 * 3, 19)))
    am = np.empty((2, 2, 2, 2), np.int32)
    maxpool2d_forward(x, 2, 2, np.empty((2, 2, 2, 2)), am)
    return [
        ("dense_forward", dense_forward, (xd, wd, bd, np.empty((3, 2)))),
        ("dense_backward_params", dense_backward_params, (xd, rd, np.empty((4, 2)), np.empty(2))),
        ("dense_backward_input", dense_backward_input, (wd, rd, np.empty((3, 4)))),
        ("dense_forward_relu", dense_forward, (xd, wd, bd, np.empty((3, 2)), True)),
        ("dense_backward_params_relu", dense_backward_params,
         (xd, rd, np.empty((4, 2)), np.empty(2), np.maximum(rand(rng, 3, 2), 0))),
        ("labels_in_range", labels_in_range, (np.array([0, 2, 1, 2]), 3)),
        ("labels_out_of_range", labels_in_range, (np.array([0, 3, 1]), 3)),
        ("im2col", im2col, (x, 3, 3, 2, 1, cols)),
        ("col2im", col2im, (rand(rng, 2 * 3 * 3, 18), 3, 3, 2, 1, np.empty_like(x))),
        ("conv2d_forward", conv2d_forward, (x, wb, 3, 3, 2, 1, np.empty((9, 19)), np.empty((2, 3, 3, 3)), 1)),
        ("conv2d_backward", conv2d_backward,
         (x, wb, dout, 3, 3, 2, 1, np.empty((9, 19)), np.empty_like(wb), np.empty_like(x), 1)),
        ("conv2d_backward_whole", conv2d_backward,
         (x, wb, dout, 3, 3, 2, 1, cols_f, np.empty_like(wb), np.empty_like(x), 1)),
        ("maxpool2d_forward", maxpool2d_forward, (x, 2, 2, np.empty((2, 2, 2, 2)), np.empty((2, 2, 2, 2), np.int32))),
        ("maxpool2d_backward", maxpool2d_backward, (rand(rng, 2, 2, 2, 2), am, 2, 2, np.empty_like(x))),
        ("maxpool2d_backward_tiled", maxpool2d_backward, (rand(rng, 2, 2, 2, 2), am, 2, 2, np.empty((2, 4, 4, 2)))),
        ("relu_forward", relu_forward, (rand(rng, 9), np.empty(9))),
        ("relu_backward", relu_backward, (rand(rng, 9), rand(rng, 9), np.empty(9))),
        ("softmax_cross_entropy", softmax_cross_entropy, (rand(rng, 4, 3), np.array([0, 2, 1, 2]), np.empty((4, 3)))),
    ]


@pytest.mark.parametrize("name,kernel,args", _pyfunc_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_kernel_agrees_with_its_py_func(name, kernel, args):
    def copy(a):
        return a.copy() if isinstance(a, np.ndarray) else a
    a1, a2 = [copy(a) for a in args], [copy(a) for a in args]
    r1, r2 = kernel(*a1), kernel.py_func(*a2)
    for u, v in zip(a1, a2):  # outputs written into buffers
        if isinstance(u, np.ndarray):
            np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-12, err_msg=name)
    if isinstance(r1, tuple):
        np.testing.assert_allclose(np.array(r1, float), np.array(r2, float), rtol=1e-12, err_msg=name)
    elif r1 is not None:
        np.testing.assert_allclose(r1, r2, rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_finite_catches_nan_and_inf_but_not_huge_finite_values(dtype):
    x = np.ones(1000, dtype)
    assert finite(x) and finite(np.zeros(0, dtype))
    x[3] = np.finfo(dtype).max
    assert finite(x)
    for bad in (np.inf, -np.inf, np.nan):
        for at in (0, 500, 999):
            y = x.copy()
            y[at] = bad
            with np.errstate(invalid="ignore"):
                assert not finite(y) and not finite.py_func(y)


@pytest.mark.parametrize("check_total", [False, True])
def test_add_into_sums_into_grad_leaves_total_and_checks_grad_or_both(check_total):
    rng = np.random.default_rng(9)
    total, grad = (rng.standard_normal(257).astype(np.float32) for _ in range(2))
    keep, want = total.copy(), total + grad
    assert add_into(total, grad, check_total)
    np.testing.assert_array_equal(grad, want)
    np.testing.assert_array_equal(total, keep)
    bad = np.ones_like(grad)
    bad[100] = np.nan
    assert not add_into(total, bad.copy(), check_total)
    np.testing.assert_array_equal(total, keep)
    bad_total = np.full_like(total, np.inf)
    assert add_into(bad_total, np.ones_like(grad), check_total) is not check_total
