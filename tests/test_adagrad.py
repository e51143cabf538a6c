"""AdaGrad against a numpy reference, lazily on sparse rows bit-equal to eager, and the optimal schedule."""
import math

import numpy as np
import pytest

from psgd.kernels.optim import adagrad_step
from psgd.nn.lazy_adagrad import LazyAdagrad
from psgd.nn.lazy_decay import LazyDecaySGD, decay_factor
from psgd.nn.optim import Adagrad, make_optimizer, make_schedule, optimal_t0


def _reference(p, g, acc, lr, eps, wd=0.0, scale=1.0):
    """AdaGrad in numpy float32, operation by operation."""
    f = np.float32
    g = g * f(scale) + f(wd) * p
    acc = acc + g * g
    return p - f(lr) * g / (np.sqrt(acc) + f(eps)), acc


@pytest.mark.parametrize("wd, scale", [(0.0, 1.0), (0.01, 0.5)])
def test_adagrad_step_is_the_numpy_reference_bit_for_bit(wd, scale):
    rng = np.random.default_rng(0)
    p = rng.standard_normal(1000).astype(np.float32)
    acc = np.abs(rng.standard_normal(1000)).astype(np.float32)
    ref_p, ref_acc = p.copy(), acc.copy()
    for _ in range(5):
        g = rng.standard_normal(1000).astype(np.float32)
        ref_p, ref_acc = _reference(ref_p, g, ref_acc, 0.3, 1e-10, wd, scale)
        assert adagrad_step(p, g, acc, None, 0.3, 1e-10, wd, scale, True)
    np.testing.assert_array_equal(p, ref_p)
    np.testing.assert_array_equal(acc, ref_acc)


def test_adagrad_leaves_a_zero_gradient_coordinate_exactly_as_it_was():
    p = np.array([1.5, -2.0, 0.25], np.float32)
    acc = np.array([0.0, 3.0, 0.5], np.float32)
    adagrad_step(p, np.zeros(3, np.float32), acc, None, 10.0, 1e-10, 0.0)
    np.testing.assert_array_equal(p, [1.5, -2.0, 0.25])
    np.testing.assert_array_equal(acc, [0.0, 3.0, 0.5])


def test_lazy_adagrad_on_touched_rows_is_bit_equal_to_eager_adagrad():
    rng = np.random.default_rng(3)
    n_rows, k = 60, 4
    w0 = rng.standard_normal(n_rows * k).astype(np.float32)
    eager, eager_acc = w0.copy(), np.zeros_like(w0)
    lazy_opt = Adagrad(n_rows * k)
    lazy = LazyAdagrad(n_rows, k, lazy_opt.eps, lazy_opt.acc)
    pushed = w0.copy()   # the same steps taken as pushed changes (hogwild adds them)
    pushed_opt = LazyAdagrad(n_rows, k, 1e-10, np.zeros(n_rows * k, np.float32))
    w = w0.copy()
    schedule = make_schedule("inverse-sqrt", 0.5, 300)
    for t in range(300):
        rows = np.sort(rng.choice(n_rows, size=int(rng.integers(1, 8)), replace=False))
        g = np.zeros((n_rows, k), np.float32)
        g[rows] = rng.standard_normal((len(rows), k))
        adagrad_step(eager, g.ravel(), eager_acc, None, schedule(t), 1e-10, 0.0)
        before = w.reshape(n_rows, k)[rows].copy()
        assert lazy.step_in_place(w.reshape(n_rows, k), g, rows, schedule(t))
        np.testing.assert_array_equal(w.reshape(n_rows, k)[rows], eager.reshape(n_rows, k)[rows])
        untouched = np.setdiff1d(np.arange(n_rows), rows)
        np.testing.assert_array_equal(w.reshape(n_rows, k)[untouched],
                                      eager.reshape(n_rows, k)[untouched])
        assert not np.array_equal(w.reshape(n_rows, k)[rows], before)
        delta, finite = pushed_opt.step(pushed.reshape(n_rows, k), g, rows, schedule(t))
        assert finite
        pushed.reshape(n_rows, k)[rows] += delta
    np.testing.assert_array_equal(w, eager)
    np.testing.assert_array_equal(lazy_opt.acc, eager_acc)
    np.testing.assert_allclose(pushed, eager, rtol=1e-6, atol=1e-6)
    assert not np.array_equal(w, w0)


def test_a_non_finite_lazy_adagrad_step_leaves_the_rows_and_their_accumulators():
    opt = LazyAdagrad(3, 2, 1e-10, np.zeros(6, np.float32))
    w, g = np.ones((3, 2), np.float32), np.ones((3, 2), np.float32)
    g[1, 0] = np.nan
    assert not opt.step_in_place(w, g, np.array([0, 1]), 0.1)
    assert (w == 1).all() and (opt.acc == 0).all()


def test_adagrad_state_resumes_to_the_uninterrupted_trajectory():
    rng = np.random.default_rng(1)
    grads = rng.standard_normal((6, 50)).astype(np.float32)
    whole, p = make_optimizer("adagrad", 50), np.ones(50, np.float32)
    for g in grads:
        whole.step(p, g, 0.1)
    first, q = make_optimizer("adagrad", 50), np.ones(50, np.float32)
    for g in grads[:3]:
        first.step(q, g, 0.1)
    second = make_optimizer("adagrad", 50)
    second.load_state_dict({k: np.array(v) for k, v in first.state_dict().items()})
    for g in grads[3:]:
        second.step(q, g, 0.1)
    np.testing.assert_array_equal(p, q)
    assert second.steps == 6


@pytest.mark.parametrize("alpha", [1e-4, 1e-5, 1e-2])
def test_optimal_t0_is_bottous_heuristic_as_scikit_learn_computes_it(alpha):
    # |dloss(-typw, 1)| <= 1 for the log and hinge losses, so eta0 = typw = alpha ** -0.25 and
    # t0 = 1 / (eta0 alpha) = alpha ** -0.75
    for loss in ("log", "hinge"):
        assert optimal_t0(alpha, loss) == pytest.approx(alpha ** -0.75, rel=1e-12)
    schedule = make_schedule("optimal", 0.0, 100, alpha=alpha)
    assert schedule(0) == pytest.approx(alpha ** -0.25, rel=1e-12)   # scikit-learn's first eta
    assert schedule(9) == pytest.approx(1 / (alpha * (alpha ** -0.75 + 9)), rel=1e-12)


def test_inverse_sqrt_schedule():
    schedule = make_schedule("inverse-sqrt", 0.8, 100)
    assert [schedule(t) for t in (0, 3, 15)] == [0.8, 0.4, 0.2]


def test_lazy_decay_under_the_optimal_schedule_equals_eager_on_touched_rows():
    # eager: every row decays by (1 - eta_t alpha) at every step; lazily a row catches up when
    # touched. Under optimal the product telescopes: prod_{s=a}^{t-1} (1 - 1/(t0 + s)) =
    # (t0 + a - 1) / (t0 + t - 1), checked here too
    rng = np.random.default_rng(5)
    n_rows, k, alpha = 40, 3, 1e-2
    schedule = make_schedule("optimal", 0.0, 500, alpha=alpha)
    t0 = optimal_t0(alpha)
    w0 = rng.standard_normal((n_rows, k))
    eager, lazy = w0.copy(), w0.copy()
    opt = LazyDecaySGD(n_rows, k, alpha)
    for t in range(500):
        lr = schedule(t)
        rows = np.sort(rng.choice(n_rows, size=int(rng.integers(0, 4)), replace=False))
        g = np.zeros((n_rows, k))
        g[rows] = rng.standard_normal((len(rows), k))
        opt.catch_up_rows(lazy, rows)   # in place, before the batch reads them
        np.testing.assert_allclose(lazy[rows], eager[rows], rtol=1e-10, atol=1e-12)
        eager = eager - lr * (g + alpha * eager)
        lazy[rows] += opt.step(lazy, g, rows, lr)
    never = np.setdiff1d(np.arange(n_rows), np.flatnonzero(opt.last))
    factor = (t0 - 1) / (t0 + 500 - 1)
    lazy += opt.catch_up(lazy)
    np.testing.assert_allclose(lazy, eager, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(eager[never], w0[never] * factor, rtol=1e-10)
    assert math.isfinite(factor) and not np.allclose(eager, w0)


def _closed_form_eager_run(w0, grads, lrs, alpha):
    """The eager rule :mod:`psgd.nn.lazy_decay` reproduces, on every row at every step, in
    plain numpy: a row holds its value after its last step (``anchor``) and that step's index;
    at step t it is ``anchor * prod_{s=last}^{t-1} (1 - lr_s alpha)``, one rounding; a row with
    a nonzero gradient is stepped from that value and re-anchored. Yields each step's values
    (float32, every row) before the step; then the values after the last step."""
    anchor, last = w0.copy(), np.zeros(len(w0), np.int64)
    logs = np.zeros(len(lrs) + 1)
    for t, (g, lr) in enumerate(zip(grads, lrs)):
        factors = np.array([decay_factor(logs, a, t) for a in last])
        now = (anchor.astype(np.float64) * factors[:, None]).astype(np.float32)
        yield now
        rows = np.flatnonzero(np.any(g != 0, axis=1))
        stepped = (1.0 - lr * alpha) * now[rows].astype(np.float64) - lr * g[rows].astype(np.float64)
        anchor[rows], last[rows] = stepped.astype(np.float32), t + 1
        logs[t + 1] = logs[t] + np.log1p(-lr * alpha)
    factors = np.array([decay_factor(logs, a, len(lrs)) for a in last])
    yield (anchor.astype(np.float64) * factors[:, None]).astype(np.float32)


@pytest.mark.parametrize("kind,lr", [("optimal", 0.0), ("cosine", 0.5)])
def test_lazy_decay_is_bit_equal_to_the_closed_form_eager_rule(kind, lr):
    # float32 as the models hold it; rows read are compared bit for bit at every step, every
    # row at the end. The per-step product, rounded at every step, agrees only to float32
    # rounding, and this run is long enough to show that it differs in some bits.
    rng = np.random.default_rng(7)
    n_rows, k, alpha, steps = 50, 3, 1e-2, 600
    schedule = make_schedule(kind, lr, steps, alpha=alpha)
    lrs = [schedule(t) for t in range(steps)]
    w0 = rng.standard_normal((n_rows, k)).astype(np.float32)
    batches, grads = [], []
    for t in range(steps):
        rows = np.sort(rng.choice(n_rows, size=int(rng.integers(0, 5)), replace=False))
        g = np.zeros((n_rows, k), np.float32)
        g[rows] = rng.standard_normal((len(rows), k)).astype(np.float32)
        batches.append(rows)
        grads.append(g)
    eager = _closed_form_eager_run(w0, grads, lrs, alpha)
    lazy, opt = w0.copy(), LazyDecaySGD(n_rows, k, alpha)
    per_step = w0.copy()
    for t in range(steps):
        now, rows = next(eager), batches[t]
        opt.catch_up_rows(lazy, rows)   # in place, before the batch reads them
        np.testing.assert_array_equal(lazy[rows].view(np.uint32), now[rows].view(np.uint32))
        assert opt.step_in_place(lazy, grads[t], rows, lrs[t])
        per_step = per_step - np.float32(lrs[t]) * (grads[t] + np.float32(alpha) * per_step)
    final = next(eager)
    opt.catch_up_rows(lazy, np.arange(n_rows))
    np.testing.assert_array_equal(lazy.view(np.uint32), final.view(np.uint32))
    np.testing.assert_allclose(per_step, final, rtol=1e-4, atol=1e-6)
    assert not np.array_equal(per_step, final)
