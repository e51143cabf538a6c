"""Layers bound to flat float64 vectors: backward against central finite differences, forward against numpy."""
import numpy as np
import pytest

from psgd.nn.elementwise import Dropout, LeakyReLU, Sigmoid, Tanh
from psgd.nn.layers import AvgPool2D, ChannelsLast, Conv2D, Dense, Flatten, GlobalAvgPool, MaxPool2D, ReLU
from psgd.nn.norm import BatchNorm
from psgd.nn.residual import Residual


def bind_flat(layer, dtype=np.float64, seed=0):
    """Give ``layer`` views into fresh flat vectors; return (params, grad)."""
    shapes = layer.param_shapes()
    n = sum(int(np.prod(s)) for _, s in shapes)
    params, grad = np.zeros(n, dtype), np.zeros(n, dtype)
    pv, gv, o = {}, {}, 0
    for name, s in shapes:
        size = int(np.prod(s))
        pv[name], gv[name] = params[o:o + size].reshape(s), grad[o:o + size].reshape(s)
        o += size
    layer.bind(pv, gv)
    layer.init_params(np.random.default_rng(seed))
    params += 0.1 * np.random.default_rng(seed + 1).standard_normal(n)  # non-zero biases too
    return params, grad


LAYERS = [
    ("dense", lambda: Dense(7, 4), (3, 7)),
    ("dense_glorot", lambda: Dense(5, 3, init="glorot"), (2, 5)),
    ("dense_relu", lambda: Dense(7, 4, relu=True), (3, 7)),
    ("conv_same", lambda: Conv2D((6, 6, 2), 3, k=3, stride=1, pad=1), (2, 6, 6, 2)),
    ("conv_strided", lambda: Conv2D((7, 5, 3), 2, k=3, stride=2, pad=0), (2, 7, 5, 3)),
    ("pool", lambda: MaxPool2D((6, 6, 2), k=2), (2, 6, 6, 2)),
    ("relu", lambda: ReLU((4, 5)), (3, 4, 5)),
    ("relu_inplace", lambda: ReLU((4, 5), inplace=True), (3, 4, 5)),
    ("flatten", lambda: Flatten((3, 2, 2)), (2, 3, 2, 2)),
    ("channels_last", lambda: ChannelsLast((2, 3, 4)), (2, 2, 3, 4)),
    ("conv_rect", lambda: Conv2D((5, 6, 2), 3, k=(1, 3), stride=2, pad=1), (2, 5, 6, 2)),
    ("avgpool", lambda: AvgPool2D((6, 5, 2), k=3, stride=2), (2, 6, 5, 2)),
    ("gap", lambda: GlobalAvgPool((3, 4, 2)), (2, 3, 4, 2)),
    ("lrelu", lambda: LeakyReLU((4, 5), alpha=0.2), (3, 4, 5)),
    ("tanh", lambda: Tanh((6,)), (3, 6)),
    ("sigmoid_inplace", lambda: Sigmoid((6,), inplace=True), (3, 6)),
    ("dropout", lambda: Dropout((4, 5), p=0.3, seed=1), (3, 4, 5)),
    ("bn_image", lambda: BatchNorm((3, 3, 2)), (2, 3, 3, 2)),
    ("bn_vector", lambda: BatchNorm((4,)), (5, 4)),
    ("bn_relu", lambda: BatchNorm((3, 3, 2), relu=True), (2, 3, 3, 2)),
    ("res_identity", lambda: Residual((4, 4, 2), 2), (2, 4, 4, 2)),
    ("res_projection", lambda: Residual((5, 5, 2), 3, stride=2), (2, 5, 5, 2)),
]


def forward(layer, x):
    if isinstance(layer, Dropout):  # the same mask on every call
        layer.reseed(7)
    return layer.forward(x)


@pytest.mark.parametrize("name,make,xshape", LAYERS, ids=[c[0] for c in LAYERS])
def test_layer_backward_matches_finite_differences_float64(name, make, xshape):
    rng = np.random.default_rng(1)
    layer = make()
    params, grad = bind_flat(layer)
    if name == "pool":  # distinct values, so the max is unique and differentiable
        x = rng.permutation(int(np.prod(xshape))).reshape(xshape).astype(np.float64) / 10
    else:
        x = rng.standard_normal(xshape)
        if name.startswith(("relu", "lrelu")):
            x[np.abs(x) < 1e-3] = 0.5
    out = forward(layer, x.copy())
    assert out.shape == (xshape[0], *layer.out_shape)
    r = rng.standard_normal(out.shape)
    grad[:] = np.nan
    dx = layer.backward(r.copy(), need_dx=True).copy()

    def loss():
        return float((forward(layer, x.copy()) * r).sum())  # copy: an in-place layer may overwrite x

    eps = 1e-6
    for i in range(params.size):
        old = params[i]
        params[i] = old + eps
        fp = loss()
        params[i] = old - eps
        fm = loss()
        params[i] = old
        assert np.isclose(grad[i], (fp - fm) / (2 * eps), rtol=1e-5, atol=1e-7), f"{name} param {i}"
    num_dx = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        old = x[idx]
        x[idx] = old + eps
        fp = loss()
        x[idx] = old - eps
        fm = loss()
        x[idx] = old
        num_dx[idx] = (fp - fm) / (2 * eps)
    np.testing.assert_allclose(dx, num_dx, rtol=1e-5, atol=1e-7)


def test_dense_layer_forward_matches_numpy_and_uses_flat_views():
    layer = Dense(4, 3)
    params, _ = bind_flat(layer)
    x = np.random.default_rng(2).standard_normal((5, 4))
    w, b = params[:12].reshape(4, 3), params[12:]
    np.testing.assert_allclose(layer.forward(x), x @ w + b)
    params[:] = 0.0
    np.testing.assert_array_equal(layer.forward(x), 0.0)


def test_conv_layer_forward_matches_a_direct_numpy_loop():
    layer = Conv2D((5, 5, 2), 3, k=3, stride=2, pad=1)
    bind_flat(layer)
    x = np.random.default_rng(3).standard_normal((2, 5, 5, 2))
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    ref = np.zeros((2, 3, 3, 3))
    for b in range(2):
        for oh in range(3):
            for ow in range(3):
                for f in range(3):
                    patch = xp[b, 2 * oh:2 * oh + 3, 2 * ow:2 * ow + 3, :]
                    ref[b, oh, ow, f] = (patch * layer.w[..., f]).sum() + layer.b[f]
    np.testing.assert_allclose(layer.forward(x), ref, rtol=1e-12, atol=1e-12)


def test_inplace_relu_overwrites_its_input_and_dy_and_agrees_with_the_copying_one():
    x, dy = np.array([[-1.0, 2.0, 0.5, -3.0]]), np.array([[1.0, 1.0, 1.0, 1.0]])
    plain, inplace = ReLU((4,)), ReLU((4,), inplace=True)
    expect_out, expect_dx = plain.forward(x).copy(), plain.backward(dy).copy()
    xi, dyi = x.copy(), dy.copy()
    out = inplace.forward(xi)
    assert out is xi and np.array_equal(xi, expect_out)
    dx = inplace.backward(dyi)
    assert dx is dyi and np.array_equal(dyi, expect_dx)
    assert np.array_equal(x, [[-1.0, 2.0, 0.5, -3.0]])  # the copying layer left its input alone


def test_dense_relu_equals_dense_then_relu_and_leaves_a_read_only_dy_alone():
    rng = np.random.default_rng(5)
    fused, dense, relu = Dense(6, 5, relu=True), Dense(6, 5), ReLU((5,))
    bind_flat(fused, seed=3)
    p2, g2 = bind_flat(dense, seed=3)
    x, dy = rng.standard_normal((4, 6)), rng.standard_normal((4, 5))
    np.testing.assert_array_equal(fused.forward(x), relu.forward(dense.forward(x)))
    frozen = dy.copy()
    frozen.flags.writeable = False
    dx = fused.backward(frozen)
    np.testing.assert_array_equal(dx, dense.backward(relu.backward(dy)))
    np.testing.assert_array_equal(fused.dw, dense.dw)
    np.testing.assert_array_equal(fused.db, dense.db)
    np.testing.assert_array_equal(frozen, dy)


def test_first_layer_skips_the_input_gradient():
    layer = Conv2D((4, 4, 1), 2, k=3, pad=1)
    bind_flat(layer)
    layer.forward(np.ones((1, 4, 4, 1)))
    assert layer.backward(np.ones((1, 4, 4, 2)), need_dx=False) is None


def test_layers_reject_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        Conv2D((3, 3, 1), 4, k=5)
    with pytest.raises(ValueError, match="does not fit"):
        MaxPool2D((1, 1, 4), k=2)


def test_dropout_is_the_identity_outside_training_and_drops_about_p_in_training():
    layer = Dropout((1000,), p=0.4, seed=0)
    x = np.ones((2, 1000))
    out = layer.forward(x)
    assert 0.35 < (out == 0).mean() < 0.45 and np.allclose(out[out != 0], 1 / 0.6)
    layer.set_mode("eval")
    assert layer.forward(x) is x


@pytest.mark.parametrize("rows, channels", [(0, 3), (5, 3), (65536, 32), (9000, 64)])
def test_calibration_sums_are_the_whole_batch_float64_sums_without_its_copies(rows, channels):
    import tracemalloc
    from psgd.nn.norm import CALIBRATION_BLOCK_BYTES, batch_sums
    x2 = (np.random.default_rng(rows).standard_normal((rows, channels)) * 3 + 1).astype(np.float32)
    whole = x2.astype(np.float64)
    tracemalloc.start()
    s, q = batch_sums(x2)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(s, whole.sum(axis=0)) and np.array_equal(q, (whole * whole).sum(axis=0))
    assert peak <= 4 * CALIBRATION_BLOCK_BYTES + 16 * channels + 4096


def test_batchnorm_calibration_gives_the_population_statistics():
    bn = BatchNorm((2, 2, 3))
    bind_flat(bn)
    rng = np.random.default_rng(4)
    batches = [rng.standard_normal((4, 2, 2, 3)) * 2 + 1 for _ in range(3)]
    bn.set_mode("calibrate")
    bn.begin_calibration()
    for b in batches:
        bn.forward(b)
    bn.end_calibration()
    every = np.concatenate(batches).reshape(-1, 3)
    np.testing.assert_allclose(bn.mean, every.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(bn.var, every.var(axis=0), rtol=1e-10)
    bn.set_mode("eval")
    x = batches[0]
    want = bn.gamma * (x - bn.mean) / np.sqrt(bn.var + bn.eps) + bn.beta
    np.testing.assert_allclose(bn.forward(x), want, rtol=1e-12)
