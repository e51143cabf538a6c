"""Models from the spec language and the presets: shapes, float64 gradients, batch-norm statistics,
dropout masks, and one clear line naming the token for every bad spec."""
import numpy as np
import pytest

from psgd.nn.model import build_model
from psgd.nn.layers import ReLU
from psgd.nn.spec import SpecError

SMALL = "conv:4x3:pad1-bn-lrelu:0.1-res:4-res:6:s2-avgpool:2-conv:5x1x3:pad1-tanh-flatten-dense:7-bn-sigmoid-dropout:0.3-dense:3"


def batch(n, shape, classes, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, *shape)), rng.integers(0, classes, n)


def test_small_spec_builds_every_layer_kind_on_the_data_shape():
    m = build_model(SMALL, input_shape=(2, 8, 8))
    kinds = {type(layer).__name__ for layer in m.layers}
    assert {"Conv2D", "BatchNorm", "LeakyReLU", "Residual", "AvgPool2D", "Tanh", "Flatten", "Dense",
            "Sigmoid", "Dropout"} <= kinds
    assert m.input_shape == (2, 8, 8) and m.n_classes == 3
    assert len(m.batchnorms) == 2 + 2 + 3 and m.stochastic
    ends = [(a, b) for _, _, a, b in m.param_ranges]
    assert ends[0][0] == 0 and ends[-1][1] == m.n_params
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(ends[:-1], ends[1:]))


def test_small_spec_gradient_matches_finite_differences_float64():
    m = build_model(SMALL, seed=1, dtype=np.float64, input_shape=(2, 8, 8))
    m.params[:] += 0.05 * np.random.default_rng(0).standard_normal(m.n_params)
    x, y = batch(4, (2, 8, 8), 3, seed=1)

    def loss():
        m.reseed(0, 5)   # the same dropout mask for every evaluation
        return m.loss_and_grad(x, y)[0]

    loss()
    grad = m.grad.copy()
    rng = np.random.default_rng(2)
    idx = np.concatenate([rng.integers(a, b, 3) for _, _, a, b in m.param_ranges])
    eps = 1e-6
    for i in idx:
        old = m.params[i]
        m.params[i] = old + eps
        fp = loss()
        m.params[i] = old - eps
        fm = loss()
        m.params[i] = old
        assert np.isclose(grad[i], (fp - fm) / (2 * eps), rtol=1e-4, atol=1e-8), f"param {i}"


@pytest.mark.parametrize("name,lo,hi", [("cifar-cnn", 300_000, 1_000_000), ("resnet8", 60_000, 100_000),
                                        ("resnet20", 250_000, 300_000)])
def test_presets_take_the_data_shape_and_classes(name, lo, hi):
    m = build_model(name, input_shape=(3, 32, 32), n_classes=10)
    assert lo <= m.n_params <= hi and m.input_shape == (3, 32, 32) and m.n_classes == 10
    small = build_model(name, input_shape=(3, 16, 16), n_classes=4)
    assert small.n_classes == 4 and small.input_shape == (3, 16, 16)


def test_evaluation_with_the_batch_as_calibration_set_gives_the_training_loss():
    m = build_model("conv:4x3:pad1-bn-relu-res:4-gap-dense:8-bn-relu-dense:3", seed=0,
                    dtype=np.float64, input_shape=(1, 6, 6))
    x, y = batch(32, (1, 6, 6), 3)
    with pytest.raises(ValueError, match="set_calibration"):
        m.evaluate(x, y)
    m.set_calibration(x)        # population statistics of x == x's batch statistics
    train_loss = m.loss_and_grad(x, y)[0]
    eval_loss, _ = m.evaluate(x, y, batch_size=5)   # other batches: same statistics
    assert np.isclose(eval_loss, train_loss, rtol=1e-10)
    m.set_calibration(x[:16])
    assert not np.isclose(m.evaluate(x, y)[0], train_loss, rtol=1e-6)


def test_dropout_masks_follow_the_key_and_are_off_at_evaluation():
    m = build_model("dense:16-relu-dropout:0.5-dense:3", seed=0, input_shape=(5,))
    x, y = batch(8, (5,), 3)
    losses = []
    for key in [(0, 1), (0, 1), (1, 1)]:
        m.reseed(*key)
        losses.append(m.loss_and_grad(x, y)[0])
    assert losses[0] == losses[1] != losses[2]
    assert m.evaluate(x, y) == m.evaluate(x, y)


BAD = [
    ("conv:8x3-foo-dense:10", "token 2 'foo' is not a layer"),
    ("conv:8x3-pool:2-pool:2-pool:2-pool:2-pool:2-flatten-dense:10", "token 6 'pool:2' does not fit its 1x1x8 input: it would leave 0 pixels"),
    ("conv:8x3:pad1-pool:2-dense:10", "token 3 'dense:10' follows a 16x16x8 image; put 'flatten' or 'gap' before it"),
    ("conv:8x3-gap", "token 2 'gap' ends the spec; the last token must be dense:N"),
    ("conv:8-gap-dense:10", "token 1 'conv:8' has '8'; expected conv:FxK"),
    ("conv:8x3:q1-gap-dense:10", "unknown option 'q1'"),
    ("conv:8xa-gap-dense:10", "'a' where a positive integer was expected"),
    ("conv:8x40-gap-dense:10", "does not fit its 32x32x3 input: it would leave 0x0 pixels"),
    ("conv:8x3--dense:10", "token 2 is empty"),
    ("flatten-dense:10-gap-dense:4", "token 3 'gap' needs an image (HxWxC) input, but follows a vector of 10"),
    ("gap-dropout:1-dense:4", "token 2 'dropout:1' needs a drop probability in [0, 1)"),
    ("gap-lrelu:2-dense:4", "needs a slope in (0, 1)"),
    ("gap-relu:3-dense:4", "token 2 'relu:3' has 1 argument(s)"),
    ("gap-dense:1", "fewer than 2 classes"),
    ("resnet", "token 1 'resnet' is not a layer"),
]


@pytest.mark.parametrize("spec,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_spec_is_one_line_naming_the_token(spec, message):
    with pytest.raises(SpecError) as info:
        build_model(spec, input_shape=(3, 32, 32))
    text = str(info.value)
    assert message in text and "\n" not in text and text.startswith(f"model spec {spec!r}")


def test_a_token_spec_needs_the_input_shape():
    with pytest.raises(ValueError, match="input shape from the data"):
        build_model("gap-dense:3")


def test_bn_relu_builds_one_fused_layer_equal_to_the_two():
    spec = "conv:4x3:pad1-bn-relu-conv:4x3-bn-tanh-flatten-dense:3"
    fused = build_model(spec, seed=2, dtype=np.float64, input_shape=(2, 6, 6))
    assert [type(layer).__name__ for layer in fused.layers].count("ReLU") == 0
    assert fused.layers[2].relu and not fused.layers[4].relu
    two = build_model(spec, seed=2, dtype=np.float64, input_shape=(2, 6, 6))
    bn = two.layers[2]
    bn.relu = False
    relu = ReLU(bn.out_shape)
    two.layers.insert(3, relu)
    x, y = batch(4, (2, 6, 6), 3, seed=3)
    assert fused.loss_and_grad(x, y) == two.loss_and_grad(x, y)
    np.testing.assert_allclose(fused.grad, two.grad, rtol=1e-12, atol=1e-14)


def test_dense_relu_builds_one_fused_layer_equal_to_the_two():
    spec = "dense:6-relu-dropout:0.3-dense:5-relu-tanh-dense:3"
    fused = build_model(spec, seed=2, dtype=np.float64, input_shape=(7,))
    assert [type(layer).__name__ for layer in fused.layers] == ["Dense", "Dropout", "Dense", "Tanh", "Dense"]
    assert fused.layers[0].relu and fused.layers[2].relu and not fused.layers[4].relu
    two = build_model(spec, seed=2, dtype=np.float64, input_shape=(7,))
    for i in (2, 0):
        two.layers[i].relu = False
        two.layers.insert(i + 1, ReLU(two.layers[i].out_shape))
    x, y = batch(4, (7,), 3, seed=3)
    fused.reseed(0, 1)
    two.reseed(0, 1)
    assert fused.loss_and_grad(x, y) == two.loss_and_grad(x, y)
    np.testing.assert_array_equal(fused.grad, two.grad)
    mlp = build_model("mlp:7-6-5-3")
    assert [layer.relu for layer in mlp.layers] == [True, True, False]
