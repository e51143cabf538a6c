"""The CNN kernels beyond LeNet's (rectangular conv, average and global pooling, leaky ReLU, tanh,
sigmoid, dropout, batch norm, the residual join) against numpy, float64 finite differences and .py_func."""
import numpy as np
import pytest

from psgd.kernels.activation import (leaky_relu_backward, leaky_relu_forward, relu_backward,
                                     sigmoid_backward, sigmoid_forward, tanh_backward,
                                     tanh_forward)
from psgd.kernels.batchnorm import (batchnorm_backward, batchnorm_forward_eval,
                                    batchnorm_forward_train)
from psgd.kernels.conv import conv2d_backward, conv2d_forward, conv_out_size
from psgd.kernels.dropout import dropout_backward, dropout_forward
from psgd.kernels.pool import (avgpool2d_backward, avgpool2d_forward, global_avgpool_backward,
                               global_avgpool_forward, pool_out_size)
from psgd.kernels.residual import accumulate, add_relu_forward
from test_kernels import numeric_grad, rand


def windows(x, k, stride):
    """The k*k strided views of (B, H, W, C) whose elementwise reduction pools."""
    oh, ow = pool_out_size(x.shape[1], k, stride), pool_out_size(x.shape[2], k, stride)
    return [x[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride, :]
            for i in range(k) for j in range(k)]


def ref_avgpool(x, k, stride):
    return sum(windows(x, k, stride)) / (k * k)


def ref_conv_rect(x, w, b, stride, pad):
    kh, kw, _, f = w.shape
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh, ow = (xp.shape[1] - kh) // stride + 1, (xp.shape[2] - kw) // stride + 1
    out = np.zeros((x.shape[0], oh, ow, f))
    for i in range(kh):
        for j in range(kw):
            out += xp[:, i:i + stride * (oh - 1) + 1:stride, j:j + stride * (ow - 1) + 1:stride, :] @ w[i, j]
    return out + b


def ref_batchnorm(x, gamma, beta, eps):
    mean, var = x.mean(axis=0), x.var(axis=0)
    return gamma * (x - mean) / np.sqrt(var + eps) + beta


# ---------------------------------------------------------------- rectangular conv


@pytest.mark.parametrize("kh,kw,stride,pad", [(1, 3, 1, 1), (3, 1, 2, 0), (2, 5, 1, 2), (1, 1, 2, 0)])
def test_rectangular_conv_matches_numpy_and_finite_differences(kh, kw, stride, pad):
    rng = np.random.default_rng(0)
    nb, h, w_, c, f = 2, 6, 7, 2, 3
    x, w, b = rand(rng, nb, h, w_, c), rand(rng, kh, kw, c, f), rand(rng, f)
    oh, ow = conv_out_size(h, kh, stride, pad), conv_out_size(w_, kw, stride, pad)
    cols, out = np.empty((oh * ow, kh * kw * c + 1)), np.empty((nb, oh, ow, f))
    wb = np.concatenate([w.reshape(-1, f), b[None]])
    conv2d_forward(x, wb, kh, kw, stride, pad, cols, out, 1)
    np.testing.assert_allclose(out, ref_conv_rect(x, w, b, stride, pad), rtol=1e-12, atol=1e-12)
    r = rand(rng, *out.shape)
    dwb, dx = np.full_like(wb, np.nan), np.full_like(x, np.nan)
    conv2d_backward(x, wb, r, kh, kw, stride, pad, cols, dwb, dx, 1)
    loss = lambda: float((ref_conv_rect(x, w, b, stride, pad) * r).sum())  # noqa: E731
    np.testing.assert_allclose(dwb[:-1].reshape(w.shape), numeric_grad(loss, w), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------- pooling


@pytest.mark.parametrize("k,stride,h,w", [(2, 2, 6, 6), (3, 2, 7, 6), (2, 1, 5, 4), (3, 3, 7, 7)])
def test_avgpool_matches_numpy_and_finite_differences(k, stride, h, w):
    rng = np.random.default_rng(1)
    x = rand(rng, 2, h, w, 3)
    oh, ow = pool_out_size(h, k, stride), pool_out_size(w, k, stride)
    out = avgpool2d_forward(x, k, stride, np.empty((2, oh, ow, 3)))
    np.testing.assert_allclose(out, ref_avgpool(x, k, stride), rtol=1e-12, atol=1e-12)
    r = rand(rng, *out.shape)
    dx = avgpool2d_backward(r, k, stride, np.full_like(x, np.nan))
    loss = lambda: float((ref_avgpool(x, k, stride) * r).sum())  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)


def test_global_avgpool_matches_numpy_and_finite_differences():
    rng = np.random.default_rng(2)
    x = rand(rng, 3, 4, 5, 2)
    out = global_avgpool_forward(x, np.empty((3, 2)))
    np.testing.assert_allclose(out, x.mean(axis=(1, 2)), rtol=1e-12)
    r = rand(rng, 3, 2)
    dx = global_avgpool_backward(r, np.full_like(x, np.nan))
    loss = lambda: float((x.mean(axis=(1, 2)) * r).sum())  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------- activations

ACTIVATIONS = [  # name, forward(x, out), backward(out, dout, dx), numpy reference
    ("leaky_relu", lambda x, o: leaky_relu_forward(x, 0.1, o),
     lambda o, g, d: leaky_relu_backward(o, 0.1, g, d), lambda x: np.where(x > 0, x, 0.1 * x)),
    ("tanh", tanh_forward, tanh_backward, np.tanh),
    ("sigmoid", sigmoid_forward, sigmoid_backward, lambda x: 1.0 / (1.0 + np.exp(-x))),
]


@pytest.mark.parametrize("name,fwd,bwd,ref", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activation_matches_numpy(name, fwd, bwd, ref, dtype):
    rng = np.random.default_rng(3)
    x = (rand(rng, 200) * 4).astype(dtype)
    np.testing.assert_allclose(fwd(x, np.empty_like(x)), ref(x.astype(np.float64)),
                               rtol=1e-6 if dtype == np.float32 else 1e-12, atol=1e-7)


@pytest.mark.parametrize("name,fwd,bwd,ref", ACTIVATIONS, ids=[a[0] for a in ACTIVATIONS])
def test_activation_backward_matches_finite_differences_float64(name, fwd, bwd, ref):
    rng = np.random.default_rng(4)
    x = rand(rng, 60) * 3
    x[np.abs(x) < 1e-3] = 0.5  # keep away from leaky ReLU's kink
    r = rand(rng, 60)
    out = fwd(x, np.empty_like(x))
    loss = lambda: float((ref(x) * r).sum())  # noqa: E731
    np.testing.assert_allclose(bwd(out, r, np.empty_like(r)), numeric_grad(loss, x), rtol=1e-6, atol=1e-8)


def test_sigmoid_does_not_overflow_for_huge_inputs():
    x = np.array([-1e4, -800.0, 0.0, 800.0, 1e4])
    with np.errstate(over="raise"):
        out = sigmoid_forward(x, np.empty_like(x))
    np.testing.assert_array_equal(out, [0.0, 0.0, 0.5, 1.0, 1.0])


# ---------------------------------------------------------------- dropout


def test_dropout_keeps_and_scales_exactly_where_u_is_at_least_p():
    rng = np.random.default_rng(5)
    x, u, r = rand(rng, 1000), rng.random(1000).astype(np.float32), rand(rng, 1000)
    out = dropout_forward(x, u, 0.25, np.empty_like(x))
    np.testing.assert_allclose(out, np.where(u >= 0.25, x / 0.75, 0.0), rtol=1e-15)
    assert 0.2 < (out == 0).mean() < 0.3
    loss = lambda: float((np.where(u >= 0.25, x / 0.75, 0.0) * r).sum())  # noqa: E731
    np.testing.assert_allclose(dropout_backward(r, u, 0.25, np.empty_like(r)),
                               numeric_grad(loss, x), rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- batch norm


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("relu", [False, True])
def test_batchnorm_forward_matches_numpy(dtype, relu):
    rng = np.random.default_rng(6)
    x = (rand(rng, 50, 4) * 3 + 2).astype(dtype)
    g, b = rand(rng, 4, dtype=dtype), rand(rng, 4, dtype=dtype)
    out, mean, invstd = np.empty_like(x), np.empty(4), np.empty(4)
    batchnorm_forward_train(x, g, b, 1e-5, relu, out, mean, invstd)
    x64 = x.astype(np.float64)
    ref = ref_batchnorm(x64, g, b, 1e-5)
    ref = np.maximum(ref, 0.0) if relu else ref
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, x64.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(invstd, 1 / np.sqrt(x64.var(axis=0) + 1e-5), rtol=1e-6)
    # with the batch's own statistics, evaluation gives the training output
    ev = batchnorm_forward_eval(x, g, b, x64.mean(axis=0), x64.var(axis=0), 1e-5, relu, np.empty_like(x))
    np.testing.assert_allclose(ev, out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("relu", [False, True])
def test_batchnorm_backward_matches_finite_differences_float64(relu):
    rng = np.random.default_rng(7)
    x, g, b, r = rand(rng, 12, 3) * 2 + 1, rand(rng, 3), rand(rng, 3), rand(rng, 12, 3)
    out, mean, invstd = np.empty_like(x), np.empty(3), np.empty(3)
    batchnorm_forward_train(x, g, b, 1e-5, relu, out, mean, invstd)
    assert not relu or 0 < (out > 0).sum() < out.size  # the ReLU cuts some, not all
    dx, dg, db = np.full_like(x, np.nan), np.full(3, np.nan), np.full(3, np.nan)
    batchnorm_backward(r, x, mean, invstd, g, out, relu, dx, dg, db)
    act = (lambda v: np.maximum(v, 0.0)) if relu else (lambda v: v)
    loss = lambda: float((act(ref_batchnorm(x, g, b, 1e-5)) * r).sum())  # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dg, numeric_grad(loss, g), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(db, numeric_grad(loss, b), rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- residual join


def test_add_relu_and_accumulate_match_numpy_and_finite_differences():
    rng = np.random.default_rng(8)
    a, b, r = rand(rng, 80), rand(rng, 80), rand(rng, 80)
    s = a + b
    a[np.abs(s) < 1e-3] += 0.5
    out = add_relu_forward(a, b, np.empty_like(a))
    np.testing.assert_array_equal(out, np.maximum(a + b, 0))
    g = relu_backward(out, r, np.empty_like(r))
    loss = lambda: float((np.maximum(a + b, 0) * r).sum())  # noqa: E731
    np.testing.assert_allclose(g, numeric_grad(loss, a), rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g, numeric_grad(loss, b), rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(accumulate(a.copy(), b), a + b)


# ---------------------------------------------------------------- compiled == .py_func


def _pyfunc_cases():
    rng = np.random.default_rng(9)
    x4, x2, v = rand(rng, 2, 5, 6, 3), rand(rng, 10, 3) + 1, rand(rng, 9)
    u = rng.random(9).astype(np.float32)
    g, b = rand(rng, 3), rand(rng, 3)
    bn_out, mean, invstd = np.empty_like(x2), np.empty(3), np.empty(3)
    batchnorm_forward_train(x2, g, b, 1e-5, True, bn_out, mean, invstd)
    return [
        ("avgpool2d_forward", avgpool2d_forward, (x4, 2, 2, np.empty((2, 2, 3, 3)))),
        ("avgpool2d_backward", avgpool2d_backward, (rand(rng, 2, 2, 2, 3), 3, 2, np.empty_like(x4))),
        ("global_avgpool_forward", global_avgpool_forward, (x4, np.empty((2, 3)))),
        ("global_avgpool_backward", global_avgpool_backward, (rand(rng, 2, 3), np.empty_like(x4))),
        ("leaky_relu_forward", leaky_relu_forward, (v, 0.2, np.empty(9))),
        ("leaky_relu_backward", leaky_relu_backward, (v, 0.2, rand(rng, 9), np.empty(9))),
        ("tanh_forward", tanh_forward, (v, np.empty(9))),
        ("tanh_backward", tanh_backward, (np.tanh(v), rand(rng, 9), np.empty(9))),
        ("sigmoid_forward", sigmoid_forward, (v * 30, np.empty(9))),
        ("sigmoid_backward", sigmoid_backward, (1 / (1 + np.exp(-v)), rand(rng, 9), np.empty(9))),
        ("dropout_forward", dropout_forward, (v, u, 0.3, np.empty(9))),
        ("dropout_backward", dropout_backward, (v, u, 0.3, np.empty(9))),
        ("batchnorm_forward_train", batchnorm_forward_train,
         (x2, g, b, 1e-5, True, np.empty_like(x2), np.empty(3), np.empty(3))),
        ("batchnorm_forward_eval", batchnorm_forward_eval,
         (x2, g, b, rand(rng, 3), rng.random(3) + 0.5, 1e-5, True, np.empty_like(x2))),
        ("batchnorm_backward", batchnorm_backward,
         (rand(rng, 10, 3), x2, mean, invstd, g, bn_out, True, np.empty_like(x2), np.empty(3), np.empty(3))),
        ("add_relu_forward", add_relu_forward, (v, rand(rng, 9), np.empty(9))),
        ("accumulate", accumulate, (v.copy(), rand(rng, 9))),
    ]


@pytest.mark.parametrize("name,kernel,args", _pyfunc_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_kernel_agrees_with_its_py_func(name, kernel, args):
    a1 = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    a2 = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kernel(*a1)
    kernel.py_func(*a2)
    for p, q in zip(a1, a2):
        if isinstance(p, np.ndarray):
            np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-12, err_msg=name)
