"""Optimizer kernels against plain numpy references; schedules; bad hyper-parameters."""
import math

import numpy as np
import pytest

from psgd.kernels import optim as K
from psgd.nn.optim import make_optimizer, make_schedule


def numpy_reference(name, p, grads, lr, wd, mu=0.9, b1=0.9, b2=0.999, eps=1e-8):
    p = p.astype(np.float64).copy()
    v = np.zeros_like(p)
    m = np.zeros_like(p)
    s = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        if name == "sgd":
            p -= lr * (g + wd * p)
        elif name in ("momentum", "nesterov"):
            g = g + wd * p
            v = mu * v + g
            p -= lr * (g + mu * v) if name == "nesterov" else lr * v
        else:
            m = b1 * m + (1 - b1) * g
            s = b2 * s + (1 - b2) * g * g
            mhat, shat = m / (1 - b1 ** t), s / (1 - b2 ** t)
            p -= lr * wd * p + lr * mhat / (np.sqrt(shat) + eps)
    return p


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov", "adam"])
@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_optimizer_matches_numpy_reference(name, wd):
    rng = np.random.default_rng(0)
    n = 1001
    p0 = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(20)]
    opt = make_optimizer(name, n, weight_decay=wd)
    p = p0.copy()
    for g in grads:
        opt.step(p, g, 0.01)
    ref = numpy_reference(name, p0, grads, 0.01, wd)
    np.testing.assert_allclose(p, ref, rtol=1e-5, atol=1e-6)
    assert opt.steps == 20


def test_kernels_agree_with_py_func():
    rng = np.random.default_rng(1)
    p = rng.standard_normal(64).astype(np.float32)
    g = rng.standard_normal(64).astype(np.float32)
    for fn, extra in [(K.sgd_update, (0.1, 0.01)),
                      (K.momentum_update, None),
                      (K.adam_update, None)]:
        a, b = p.copy(), p.copy()
        if fn is K.sgd_update:
            fn(a, g, *extra)
            fn.py_func(b, g, *extra)
        elif fn is K.momentum_update:
            va, vb = np.ones(64, np.float32), np.ones(64, np.float32)
            fn(a, g, va, 0.1, 0.9, 0.01, True)
            fn.py_func(b, g, vb, 0.1, 0.9, 0.01, True)
            np.testing.assert_allclose(va, vb, rtol=1e-5, atol=1e-6)
        else:
            ma, mb = np.zeros(64, np.float32), np.zeros(64, np.float32)
            sa, sb = np.zeros(64, np.float32), np.zeros(64, np.float32)
            fn(a, g, ma, sa, 0.1, 0.9, 0.999, 1e-8, 0.0, 1)
            fn.py_func(b, g, mb, sb, 0.1, 0.9, 0.999, 1e-8, 0.0, 1)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip_resumes_identically():
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(50).astype(np.float32) for _ in range(10)]
    a = make_optimizer("adam", 50)
    pa = np.zeros(50, np.float32)
    for g in grads[:5]:
        a.step(pa, g, 0.01)
    b = make_optimizer("adam", 50)
    b.load_state_dict({k: np.copy(v) for k, v in a.state_dict().items()})
    pb = pa.copy()
    for g in grads[5:]:
        a.step(pa, g, 0.01)
        b.step(pb, g, 0.01)
    np.testing.assert_array_equal(pa, pb)


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="lbfgs"), "unknown optimizer"),
    (dict(name="momentum", momentum=1.5), "momentum"),
    (dict(name="sgd", weight_decay=-1.0), "weight decay"),
    (dict(name="adam", beta1=1.0), "beta1"),
])
def test_bad_hyperparameters_are_rejected(kwargs, match):
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=match):
        make_optimizer(name, 10, **kwargs)


def test_step_with_wrong_slice_length_is_rejected():
    opt = make_optimizer("sgd", 10)
    with pytest.raises(ValueError, match="10 parameters"):
        opt.step(np.zeros(9, np.float32), np.zeros(9, np.float32), 0.1)


def test_schedules():
    const = make_schedule("constant", 0.1, 100)
    assert const(0) == const(99) == 0.1
    step = make_schedule("step", 0.1, 100, step_every=10, gamma=0.5)
    assert step(9) == pytest.approx(0.1) and step(10) == pytest.approx(0.05)
    cos = make_schedule("cosine", 0.1, 100, warmup=10)
    assert cos(0) == pytest.approx(0.01) and cos(9) == pytest.approx(0.1)
    assert cos(100) == pytest.approx(0.0, abs=1e-12)
    assert 0 < cos(55) < 0.1
    for bad in (dict(kind="constant", lr=-1.0), dict(kind="constant", lr=math.nan),
                dict(kind="linear", lr=0.1), dict(kind="step", lr=0.1)):
        with pytest.raises(ValueError):
            make_schedule(total_steps=10, **bad)
