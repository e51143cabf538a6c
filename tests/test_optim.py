"""Optimizer step kernels: in place == out of place == numpy float32, bitwise; float64 references; schedules."""
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


def _kernel_case(name, n=1001, seed=1):
    """(kernel, src, grad, grad2, state arrays, hyper-parameters before scale) for ``name``."""
    rng = np.random.default_rng(seed)
    src, grad, grad2 = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    if name == "sgd":
        return K.sgd_step, src, grad, grad2, [], (0.05, 0.01)
    if name in ("momentum", "nesterov"):
        velocity = rng.standard_normal(n).astype(np.float32)
        return K.momentum_step, src, grad, grad2, [velocity], (0.05, 0.9, 0.01, name == "nesterov")
    m = rng.standard_normal(n).astype(np.float32)
    v = np.abs(rng.standard_normal(n)).astype(np.float32)
    return K.adam_step, src, grad, grad2, [m, v], (0.05, 0.9, 0.999, 1e-8, 0.01, 3)


def _run_kernel(fn, src, grad, dst, state, hyper, scale, check, grad2, py=False):
    call = fn.py_func if py else fn
    if fn is K.sgd_step:
        return call(src, grad, dst, *hyper, scale, check, grad2)
    return call(src, grad, *state, dst, *hyper, scale, check, grad2)


def numpy_float32_step(name, src, g, state, hyper, scale):
    """The kernels' float32 expressions with numpy, element-wise: same rounding, same order."""
    f = np.float32
    p, g = src.copy(), g * f(scale)
    if name == "sgd":
        lr, wd = (f(h) for h in hyper)
        return p - lr * (g + f(wd) * p), []
    if name in ("momentum", "nesterov"):
        lr, mu, wd = (f(h) for h in hyper[:3])
        g = g + wd * p
        v = mu * state[0] + g
        return (p - lr * (g + mu * v) if hyper[3] else p - lr * v), [v]
    lr, b1, b2, eps, wd, t = hyper
    m = f(b1) * state[0] + f(1 - b1) * g
    v = f(b2) * state[1] + f(1 - b2) * g * g
    step_size, inv = f(lr / (1 - b1 ** t)), f(1 / np.sqrt(1 - b2 ** t))
    return p - (f(lr * wd) * p + step_size * m / (np.sqrt(v) * inv + f(eps))), [m, v]


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov", "adam"])
@pytest.mark.parametrize("scale", [1.0, 0.25])
@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("two", [False, True], ids=["grad", "grad+grad2"])
def test_step_kernel_in_place_equals_out_of_place_bitwise_and_numpy_float32(name, scale, check,
                                                                            two):
    fn, src, grad, grad2, state, hyper = _kernel_case(name)
    g2 = grad2 if two else None
    keep = src.copy(), grad.copy(), grad2.copy()
    out_state = [s.copy() for s in state]
    dst = np.empty_like(src)
    assert _run_kernel(fn, src, grad, dst, out_state, hyper, scale, check, g2)
    for array, before in zip((src, grad, grad2), keep):   # out of place: only dst and state
        np.testing.assert_array_equal(array, before)
    for same in (False, True):     # in place: dst None, or src itself
        in_place, in_state = src.copy(), [s.copy() for s in state]
        assert _run_kernel(fn, in_place, grad, in_place if same else None, in_state, hyper,
                           scale, check, g2)
        np.testing.assert_array_equal(in_place, dst)
        for a, b in zip(in_state, out_state):
            np.testing.assert_array_equal(a, b)
    want, want_state = numpy_float32_step(name, src, grad + grad2 if two else grad, state,
                                          hyper, scale)
    np.testing.assert_array_equal(dst, want)
    for a, b in zip(out_state, want_state):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["sgd", "nesterov", "adam"])
def test_step_kernels_agree_with_py_func(name):
    fn, src, grad, grad2, state, hyper = _kernel_case(name, n=64)
    results = []
    for py in (False, True):
        dst, st = np.empty_like(src), [s.copy() for s in state]
        assert _run_kernel(fn, src, grad, dst, st, hyper, 0.5, True, grad2, py=py)
        results.append([dst, *st])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_step_kernel_check_finds_nan_and_inf_in_the_gradient_only_when_asked(name, bad):
    fn, src, grad, grad2, state, hyper = _kernel_case(name, n=100)
    big = np.full_like(grad, 3e38)          # huge but finite
    assert _run_kernel(fn, src, big, np.empty_like(src), [s.copy() for s in state], hyper,
                       1.0, True, None)
    grad[61] = bad
    for g, g2 in ((grad, None), (grad2, grad), (big, big)):   # the sum of big + big overflows
        assert not _run_kernel(fn, src, g, np.empty_like(src), [s.copy() for s in state],
                               hyper, 1.0, True, g2)
        assert _run_kernel(fn, src, g, np.empty_like(src), [s.copy() for s in state],
                           hyper, 1.0, False, g2)


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
