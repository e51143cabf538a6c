"""The Model contract: flat parameter/gradient views, deterministic init, gradients, and input errors."""
import numpy as np
import pytest

from psgd.nn.model import build_model

MNIST_LIKE = (1, 28, 28)


@pytest.fixture(scope="module")
def mlp():
    return build_model("mlp:784-32-16-10", seed=0)


@pytest.fixture(scope="module")
def lenet():
    return build_model("lenet", seed=0)


def batch(n, shape=MNIST_LIKE, classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, *shape), dtype=np.float32), rng.integers(0, classes, n)


# ---------------------------------------------------------------- shapes and attributes


def test_mlp_attributes():
    m = build_model("mlp:784-256-256-10")
    assert m.spec == "mlp:784-256-256-10"
    assert m.input_shape == (784,) and m.n_classes == 10
    assert m.n_params == 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10
    assert m.params.dtype == np.float32 and m.params.shape == (m.n_params,)
    assert m.grad.dtype == np.float32 and m.grad.shape == (m.n_params,)
    assert m.params.flags.c_contiguous and m.grad.flags.c_contiguous


def test_lenet_attributes(lenet):
    assert lenet.input_shape == (1, 28, 28) and lenet.n_classes == 10
    conv = 5 * 5 * 1 * 16 + 16 + 5 * 5 * 16 * 32 + 32
    dense = 7 * 7 * 32 * 128 + 128 + 128 * 10 + 10
    assert lenet.n_params == conv + dense


def test_two_layer_mlp_spec_is_accepted():
    m = build_model("mlp:20-3")
    assert m.n_params == 20 * 3 + 3 and m.n_classes == 3


# ---------------------------------------------------------------- flat views


@pytest.mark.parametrize("spec", ["mlp:12-5-4", "lenet"])
def test_every_layer_array_is_a_view_into_the_flat_vectors(spec):
    m = build_model(spec)
    covered = 0
    for layer in m.layers:
        for name in ("w", "b"):
            if hasattr(layer, name):
                p, g = getattr(layer, name), getattr(layer, "d" + name)
                assert np.shares_memory(p, m.params) and np.shares_memory(g, m.grad)
                covered += p.size
    assert covered == m.n_params


def test_writing_params_changes_layer_weights_and_vice_versa():
    m = build_model("mlp:6-4-3")
    dense = m.layers[0]
    m.params[:] = np.arange(m.n_params, dtype=np.float32)
    assert dense.w[0, 0] == 0.0 and dense.w[1, 0] == 4.0 and dense.b[0] == 24.0
    dense.w[2, 3] = -7.0
    assert m.params[2 * 4 + 3] == -7.0
    m.params = np.zeros(m.n_params, np.float32)  # assignment copies in, views stay live
    assert np.all(dense.w == 0.0)
    with pytest.raises(ValueError, match="shape"):
        m.params = np.zeros(3)


def test_changing_params_changes_the_output(mlp):
    x, y = batch(4)
    before = mlp.loss_and_grad(x, y)[0]
    saved = mlp.params.copy()
    mlp.params[-10:] += np.arange(10, dtype=np.float32)  # output-layer bias
    after = mlp.loss_and_grad(x, y)[0]
    mlp.params[:] = saved
    assert before != after


# ---------------------------------------------------------------- init


@pytest.mark.parametrize("spec", ["mlp:784-64-10", "lenet"])
def test_same_seed_gives_bitwise_identical_params(spec):
    a, b, c = build_model(spec, seed=3), build_model(spec, seed=3), build_model(spec, seed=4)
    assert a.params.tobytes() == b.params.tobytes()
    assert not np.array_equal(a.params, c.params)


def test_init_scale_is_he_for_hidden_layers():
    m = build_model("mlp:2000-500-10", seed=0)
    w = m.layers[0].w
    assert abs(w.std() - np.sqrt(2 / 2000)) < 0.02 * np.sqrt(2 / 2000)
    assert np.all(m.layers[0].b == 0)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("spec,shape", [("mlp:12-6-5-3", (12,)), ("lenet", MNIST_LIKE)])
def test_model_gradient_matches_finite_differences_float64(spec, shape):
    m = build_model(spec, seed=1, dtype=np.float64)
    assert m.params.dtype == np.float64
    m.params[:] += 0.05 * np.random.default_rng(0).standard_normal(m.n_params)  # non-zero biases
    x, y = batch(2, shape, classes=m.n_classes, seed=1)
    x = x.astype(np.float64)
    m.loss_and_grad(x, y)
    grad = m.grad.copy()
    rng = np.random.default_rng(2)
    # every parameter of the small mlp; a sample from each parameter array of lenet
    idx = (np.arange(m.n_params) if m.n_params < 200 else
           np.concatenate([rng.integers(a, b, 6) for _, _, a, b in m.param_ranges]))
    eps = 1e-6
    for i in idx:
        old = m.params[i]
        m.params[i] = old + eps
        fp = m.loss_and_grad(x, y)[0]
        m.params[i] = old - eps
        fm = m.loss_and_grad(x, y)[0]
        m.params[i] = old
        assert np.isclose(grad[i], (fp - fm) / (2 * eps), rtol=1e-4, atol=1e-8), f"param {i}"


def test_loss_and_grad_overwrites_grad(mlp):
    x, y = batch(8)
    mlp.loss_and_grad(x, y)
    fresh = mlp.grad.copy()
    mlp.grad[:] = np.nan
    mlp.loss_and_grad(x, y)
    np.testing.assert_array_equal(mlp.grad, fresh)
    assert np.any(fresh != 0)


@pytest.mark.parametrize("spec", ["mlp:784-32-16-10", "lenet"])
def test_a_gradient_buffer_given_to_the_model_receives_the_same_gradient(spec):
    model = build_model(spec, seed=0)
    x, y = batch(8)
    model.loss_and_grad(x, y)
    want = model.grad.copy()
    buf = np.full(model.n_params, np.nan, np.float32)   # e.g. a PS worker's push window
    model.use_grad_buffer(buf)
    assert model.grad is buf
    model.loss_and_grad(x, y)
    np.testing.assert_array_equal(buf, want)
    model.use_grad_buffer(None)                          # back to a buffer of its own
    assert not np.shares_memory(model.grad, buf)
    buf[:] = np.nan
    model.loss_and_grad(x, y)
    np.testing.assert_array_equal(model.grad, want)
    assert np.isnan(buf).all()


@pytest.mark.parametrize("bad", [np.zeros(5, np.float32), np.zeros(8, np.float64), [0.0] * 8,
                                 np.zeros(16, np.float32)[::2]],
                         ids=["short", "float64", "list", "strided"])
def test_a_gradient_buffer_of_the_wrong_shape_or_dtype_is_rejected(bad):
    model = build_model("mlp:3-2", seed=0)
    assert model.n_params == 8
    with pytest.raises(ValueError, match="gradient buffer must be a contiguous float32 vector "
                                         "of length 8"):
        model.use_grad_buffer(bad)


def test_loss_and_grad_is_the_mean_over_the_batch(mlp):
    x, y = batch(6)
    loss, correct = mlp.loss_and_grad(x, y)
    g = mlp.grad.copy()
    parts = [mlp.loss_and_grad(x[i:i + 1], y[i:i + 1]) for i in range(6)]
    assert np.isclose(loss, np.mean([p[0] for p in parts]), rtol=1e-5)
    assert correct == sum(p[1] for p in parts)
    gs = []
    for i in range(3):
        mlp.loss_and_grad(x[2 * i:2 * i + 2], y[2 * i:2 * i + 2])
        gs.append(mlp.grad.copy())
    np.testing.assert_allclose(g, np.mean(gs, axis=0), rtol=1e-4, atol=1e-7)


def test_initial_loss_is_near_log_classes(lenet):
    x, y = batch(32)
    loss, _ = lenet.loss_and_grad(x, y)
    assert 1.5 < loss < 4.0  # log(10) = 2.30


def test_mlp_accepts_image_shaped_and_flat_input_alike(mlp):
    x, y = batch(5)
    a = mlp.loss_and_grad(x, y)
    b = mlp.loss_and_grad(x.reshape(5, 784), y)
    assert a == b


def test_lenet_accepts_flat_rows_and_channel_less_images(lenet):
    x, y = batch(3)
    ref = lenet.loss_and_grad(x, y)
    assert lenet.loss_and_grad(x.reshape(3, 784), y) == ref
    assert lenet.loss_and_grad(x.reshape(3, 28, 28), y) == ref
    with pytest.raises(ValueError, match=r"\(3, 4, 196\).*expects \(B, 1, 28, 28\) or \(B, 28, 28\) or \(B, 784\)"):
        lenet.loss_and_grad(x.reshape(3, 4, 196), y)


def test_evaluate_matches_per_batch_loss_and_counts(mlp):
    x, y = batch(70)
    params = mlp.params.copy()
    loss, acc = mlp.evaluate(x, y, batch_size=32)
    np.testing.assert_array_equal(mlp.params, params)
    full_loss, correct = mlp.loss_and_grad(x, y)
    assert np.isclose(loss, full_loss, rtol=1e-5)
    assert acc == correct / 70
    assert np.array_equal(mlp.predict(x) == y, mlp.predict(x, batch_size=7) == y)
    assert (mlp.predict(x) == y).mean() == acc


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("spec", ["resnet", "mlp:784-abc", "mlp:784", "mlp:", "mlp:784--10", "mlp:784-0-10",
                                  "mlp:784-1", "lenet5", "", "mlp:-3-4"])
def test_bad_spec_raises_value_error_naming_it(spec):
    with pytest.raises(ValueError, match="spec"):
        build_model(spec)


def test_unsupported_dtype_raises_value_error():
    with pytest.raises(ValueError, match="dtype"):
        build_model("mlp:4-2", dtype=np.int32)


def test_param_ranges_tile_the_flat_vector():
    m = build_model("lenet")
    ends = [(a, b) for _, _, a, b in m.param_ranges]
    assert ends[0][0] == 0 and ends[-1][1] == m.n_params
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(ends[:-1], ends[1:]))


def test_non_string_spec_raises_value_error():
    with pytest.raises(ValueError, match="spec"):
        build_model(None)


def test_wrong_x_shape_says_expected_and_got(mlp, lenet):
    with pytest.raises(ValueError, match=r"\(5, 3, 3\).*expects \(B, 784\)"):
        mlp.loss_and_grad(np.zeros((5, 3, 3), np.float32), np.zeros(5, int))
    with pytest.raises(ValueError, match=r"\(2, 3, 28, 28\).*expects \(B, 1, 28, 28\)"):
        lenet.loss_and_grad(np.zeros((2, 3, 28, 28), np.float32), np.zeros(2, int))
    with pytest.raises(ValueError, match="shape"):
        mlp.loss_and_grad(np.zeros(784, np.float32), np.zeros(1, int))
    with pytest.raises(ValueError, match="empty"):
        mlp.evaluate(np.zeros((0, 784), np.float32), np.zeros(0, int))


def test_y_length_mismatch_raises(mlp):
    x, y = batch(4)
    with pytest.raises(ValueError, match=r"y has shape \(3,\).*\(4,\)"):
        mlp.loss_and_grad(x, y[:3])
    with pytest.raises(ValueError, match="y has shape"):
        mlp.loss_and_grad(x, y.reshape(2, 2))


@pytest.mark.parametrize("bad", [-1, 10, 99])
def test_labels_out_of_range_raise(mlp, bad):
    x, y = batch(4)
    y[2] = bad
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        mlp.loss_and_grad(x, y)
    with pytest.raises(ValueError, match=r"outside \[0, 10\)"):
        mlp.evaluate(x, y)


def test_non_integer_labels_raise(mlp):
    x, _ = batch(2)
    with pytest.raises(ValueError, match="integer"):
        mlp.loss_and_grad(x, np.array([0.5, 1.0]))
    with pytest.raises(ValueError, match="integer"):
        mlp.loss_and_grad(x, np.array(["a", "b"]))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_x_raises(mlp, bad):
    x, y = batch(4)
    x[1, 0, 3, 3] = bad
    with pytest.raises(ValueError, match="non-finite"):
        mlp.loss_and_grad(x, y)
    with pytest.raises(ValueError, match="non-finite"):
        mlp.evaluate(x, y)
