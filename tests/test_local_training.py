"""Single-process training: an MLP and the LeNet CNN each learn a synthetic 10-class image problem."""
import numpy as np
import pytest

from psgd.nn.model import build_model
from psgd.nn.optim import make_optimizer
from psgd.nn.serial import train_serial


def template_data(n, seed, noise=1.5, classes=10):
    """Class-dependent 1x28x28 templates (fixed across calls) plus per-sample Gaussian noise.

    Each template is a random 7x7 pattern in [-1, 1) blown up to 28x28 (smooth at the scale
    of the convolutions, zero-mean like normalised images); the noise std is ``noise``.
    """
    low = np.random.default_rng(1234).random((classes, 1, 7, 7)).astype(np.float32)
    templates = 2 * np.kron(low - 0.5, np.ones((1, 1, 4, 4), np.float32))
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    x = templates[y] + noise * rng.standard_normal((n, 1, 28, 28)).astype(np.float32)
    return x.astype(np.float32), y


@pytest.fixture(scope="module")
def data():
    x, y = template_data(1500, seed=0)
    xt, yt = template_data(500, seed=1)
    return x, y, xt, yt


def test_mlp_learns_synthetic_templates(data):
    x, y, xt, yt = data
    model = build_model("mlp:784-64-64-10", seed=0)
    chance = model.evaluate(xt, yt)[1]
    out = train_serial(model, x, y, optimizer="momentum", lr=0.02, batch_size=32, epochs=3, seed=0,
                      x_test=xt, y_test=yt, log=None)
    assert len(out["epochs"]) == 3 and out["steps"] == 3 * 47
    assert chance < 0.3
    assert out["final"]["test_acc"] > 0.8, out["final"]
    assert out["epochs"][-1]["train_loss"] < out["epochs"][0]["train_loss"]


def test_lenet_learns_synthetic_templates(data):
    x, y, xt, yt = data
    model = build_model("lenet", seed=0)
    chance = model.evaluate(xt, yt)[1]
    out = train_serial(model, x[:800], y[:800], optimizer="momentum", lr=0.005, batch_size=32, epochs=2,
                      seed=0, x_test=xt, y_test=yt, log=None)
    assert chance < 0.3
    assert out["final"]["test_acc"] > 0.6, out["final"]


def test_adam_and_a_schedule_also_train(data):
    x, y, xt, yt = data
    model = build_model("mlp:784-32-10", seed=1)
    opt = make_optimizer("adam", model.n_params)
    out = train_serial(model, x, y, optimizer=opt, lr=lambda step: 1e-3 if step < 40 else 5e-4,
                      batch_size=64, epochs=2, seed=1, x_test=xt, y_test=yt, log=None)
    assert out["final"]["test_acc"] > 0.6 and opt.steps == out["steps"]


def test_training_is_deterministic_given_seeds(data):
    x, y, _, _ = data
    runs = []
    for _ in range(2):
        model = build_model("mlp:784-16-10", seed=5)
        train_serial(model, x[:300], y[:300], optimizer="nesterov", lr=0.01, batch_size=50, epochs=1,
                    seed=9, log=None)
        runs.append(model.params.copy())
    assert runs[0].tobytes() == runs[1].tobytes()


def test_log_gets_one_line_per_epoch(data):
    x, y, xt, yt = data
    lines = []
    train_serial(build_model("mlp:784-8-10"), x[:100], y[:100], optimizer="sgd", lr=0.01, batch_size=40,
                epochs=2, seed=0, x_test=xt[:50], y_test=yt[:50], log=lines.append)
    assert len(lines) == 2 and lines[1].startswith("epoch 2/2") and "test loss" in lines[1]


def test_divergence_and_bad_arguments_raise_value_error(data):
    x, y, xt, yt = data
    model = build_model("mlp:784-8-10")
    with pytest.raises(ValueError, match="diverged"):
        train_serial(model, x[:200], y[:200], optimizer="sgd", lr=1e30, batch_size=20, epochs=1, seed=0, log=None)
    with pytest.raises(ValueError, match="batch_size"):
        train_serial(model, x, y, optimizer="sgd", lr=0.1, batch_size=0, epochs=1, seed=0, log=None)
    with pytest.raises(ValueError, match="x_test"):
        train_serial(model, x, y, optimizer="sgd", lr=0.1, batch_size=8, epochs=1, seed=0, x_test=xt, log=None)
    with pytest.raises(ValueError, match="optimizer"):
        train_serial(model, x, y, optimizer="rmsprop", lr=0.1, batch_size=8, epochs=1, seed=0, log=None)
