"""Lazy sparse momentum and Nesterov equal the eager dense steps after any sequence of sparse steps."""
import numpy as np
import pytest

from psgd.kernels.optim import momentum_step
from psgd.nn.lazy_momentum import LazyMomentum
from psgd.nn.optim import make_schedule


def _run(nesterov, wd, schedule, steps, varying_mu, seed=0, n_rows=40, k=3, quadratic=False):
    """Eager momentum_step on the whole vector against the lazy steps on the touched rows;
    ``quadratic``: the gradient (w - target) on the rows depends on where they are, so the rows
    must be caught up before it is taken (catch_up_rows), as before a batch's forward pass."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(n_rows * k).astype(np.float32)
    eager, vel = w0.copy(), np.zeros_like(w0)
    lazy = w0.copy()
    target = rng.standard_normal((n_rows, k)).astype(np.float32)
    opt = LazyMomentum(n_rows, k, 0.9, nesterov, wd)
    lr_at = make_schedule(schedule, 0.05, steps, warmup=5, step_every=100, gamma=0.5)
    sweeps = 0
    for t in range(steps):
        rows = np.sort(rng.choice(n_rows, size=int(rng.integers(1, 6)), replace=False))
        g = np.zeros((n_rows, k), np.float32)
        g[rows] = rng.standard_normal((len(rows), k))
        mu = float(rng.uniform(0.5, 0.95)) if varying_mu else 0.9
        if quadratic:
            g[rows] = eager.reshape(n_rows, k)[rows] - target[rows]
        momentum_step(eager, g.ravel(), vel, None, lr_at(t), mu, wd, nesterov)
        if opt.needs_sweep:
            change, moved = opt.catch_up(lazy.reshape(n_rows, k))
            still = np.setdiff1d(range(n_rows), moved)
            assert (change[still] == 0).all()
            lazy += change.ravel()
            sweeps += 1
        if quadratic or t % 2:   # the rows caught up in place first (the change would be pushed)
            before = lazy.reshape(n_rows, k)[rows].copy()
            change = opt.catch_up_rows(lazy.reshape(n_rows, k), rows)
            np.testing.assert_array_equal(lazy.reshape(n_rows, k)[rows] - before, change)
        if quadratic:
            g[rows] = lazy.reshape(n_rows, k)[rows] - target[rows]
        delta, finite = opt.step(lazy.reshape(n_rows, k), g, rows, lr_at(t), mu)
        assert finite
        lazy.reshape(n_rows, k)[rows] += delta
    change, _ = opt.catch_up(lazy.reshape(n_rows, k))
    lazy += change.ravel()
    return eager, vel, lazy, opt.velocity.ravel(), sweeps


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("wd, schedule, varying_mu", [(0.0, "constant", False), (0.01, "constant", False),
                                                      (0.01, "cosine", False), (0.0, "step", True)])
def test_lazy_momentum_equals_eager_after_sparse_steps(nesterov, wd, schedule, varying_mu):
    eager, vel, lazy, lazy_vel, sweeps = _run(nesterov, wd, schedule, 400, varying_mu)
    assert sweeps >= 2   # the products restarted on the way (det Q_t small)
    np.testing.assert_allclose(lazy, eager, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lazy_vel, vel, rtol=2e-5, atol=2e-5)
    assert not np.array_equal(eager, lazy + 1)   # sanity: a wrong result would fail


@pytest.mark.parametrize("nesterov", [False, True])
def test_lazy_momentum_takes_the_gradient_where_eager_momentum_does(nesterov):
    # a gradient that depends on the parameters: rows must be caught up before it is taken
    eager, vel, lazy, lazy_vel, _ = _run(nesterov, 0.01, "cosine", 300, False, quadratic=True)
    np.testing.assert_allclose(lazy, eager, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lazy_vel, vel, rtol=2e-5, atol=2e-5)


def test_lazy_momentum_with_no_missed_step_is_the_eager_step():
    # every row touched every step: no catch-up, the same arithmetic as momentum_step
    n_rows, k = 5, 2
    rng = np.random.default_rng(1)
    w = rng.standard_normal(n_rows * k).astype(np.float32)
    g = rng.standard_normal((n_rows, k)).astype(np.float32)
    eager, vel = w.copy(), np.zeros_like(w)
    momentum_step(eager, g.ravel(), vel, None, 0.1, 0.9, 0.0, False)
    delta, _ = LazyMomentum(n_rows, k).step(w.reshape(n_rows, k), g, np.arange(n_rows), 0.1)
    np.testing.assert_allclose(w + delta.ravel(), eager, rtol=1e-6)


def test_a_non_finite_lazy_momentum_step_leaves_the_state():
    opt = LazyMomentum(3, 2)
    w, g = np.ones((3, 2), np.float32), np.zeros((3, 2), np.float32)
    g[1, 0] = np.nan
    _, finite = opt.step(w, g, np.array([0, 1]), 0.1)
    assert not finite and (opt.velocity == 0).all() and (opt.last == 0).all()
