"""Held hot rows of sparse hogwild (psgd/hogwild/hot.py): which rows, no change lost, the counter."""
import numpy as np
import pytest

from psgd.hogwild import DEFAULT_HOLD, fused
from psgd.hogwild.hot import add_or_hold, hot_rows, read_held, read_rows, settle, step_held


def test_hot_rows_are_the_features_most_batches_touch_and_the_bias():
    # 100 samples over 5 features: feature 0 in all, 1 in 30 % (a batch of 4 touches it with
    # probability 1 - 0.7**4 = 0.76), 2 in 10 % (0.34), 3 in 1 %, 4 never; row 5 is the bias
    indices = np.concatenate([np.zeros(100), np.ones(30), np.full(10, 2), [3]]).astype(np.int32)
    slot, hot = hot_rows(indices, 100, 6, batch=4, hold=8)
    assert hot.tolist() == [0, 1, 5]
    assert slot.tolist() == [0, 1, -1, -1, -1, 2]
    # a batch of 8 touches feature 2 with probability 1 - 0.9**8 = 0.57: hot then
    assert hot_rows(indices, 100, 6, batch=8, hold=8)[1].tolist() == [0, 1, 2, 5]
    slot, hot = hot_rows(indices, 100, 6, batch=4, hold=1)   # hold 1: every step adds
    assert hot.size == 0 and (slot == -1).all()


class Worker:
    """One worker's side of the held-row kernels on a shared vector of 6 rows of 3."""

    def __init__(self, shared, count, slot, hot, steps):
        self.shared, self.count, self.slot, self.hot = (shared,), count, slot, hot
        self.bounds = np.array([0, shared.size], np.int64)
        self.params = np.full(shared.size, np.nan, np.float32)
        self.held = np.zeros((hot.size, 3), np.float32)
        self.staleness = np.full(steps, -1, np.int64)
        self.first, self.step = 0, 0
        read_held(self.params, self.shared, self.bounds, hot, 3)
        self.base = int(count[0])

    def take(self, rows, change):
        read_rows(self.params, self.shared, self.bounds, rows, 3, self.slot)
        step_held(self.params.reshape(-1, 3), rows, self.slot, change)
        add_or_hold(self.shared, self.bounds, rows, 3, change.ravel(), self.slot, self.held)
        self.staleness[self.step] = 0
        self.step += 1

    def settle(self):
        self.base = settle(self.shared, self.bounds, self.hot, 3, self.held, self.params,
                           self.count, self.staleness, self.first, self.step, self.base)
        self.first = self.step


def test_held_changes_all_land_and_every_step_is_counted():
    rng = np.random.default_rng(0)
    initial = rng.standard_normal(18).astype(np.float32)
    shared, count = initial.copy(), np.zeros(1, np.int64)
    slot = np.array([-1, 0, -1, -1, -1, 1], np.int64)     # rows 1 and 5 (the bias) are held
    hot = np.array([1, 5], np.int64)
    a, b = Worker(shared, count, slot, hot, 6), Worker(shared, count, slot, hot, 6)
    total = np.zeros((6, 3), np.float64)
    script = [(a, [0, 1, 5]), (b, [1, 2, 5]), (a, [1, 3, 5]), "a", (b, [0, 4, 5]), (b, [1, 5]),
              "b", (a, [2, 5]), (b, [1, 3, 5]), "a", "b"]
    for event in script:
        if isinstance(event, str):
            {"a": a, "b": b}[event].settle()
            continue
        worker, rows = event
        rows = np.array(rows, np.int64)
        change = rng.standard_normal((rows.size, 3)).astype(np.float32)
        before = shared.reshape(6, 3)[rows].copy()
        worker.take(rows, change)
        total[rows] += change
        cold = slot[rows] < 0   # cold rows land at once, held ones wait for the settle
        assert np.allclose(shared.reshape(6, 3)[rows[cold]], before[cold] + change[cold], atol=1e-6)
        assert np.array_equal(shared.reshape(6, 3)[rows[~cold]], before[~cold])
        if worker is a and rows.tolist() == [1, 3, 5]:   # a steps on its own copy of row 1
            assert np.isclose(a.params[4], shared[4] + a.held[0, 1], atol=1e-6)
    assert np.allclose(shared, initial + total.ravel(), atol=1e-5)   # no change lost
    assert count[0] == 7   # a's 3 steps and b's 4
    # each step's staleness: the other worker's steps counted between its settles: a's first two
    # settle before b's, b's first three after a's two, a's third after b's three, b's last after
    # a's third
    assert a.staleness[:3].tolist() == [0, 0, 3] and b.staleness[:4].tolist() == [2, 2, 2, 1]
    assert np.allclose(b.params.reshape(6, 3)[hot], shared.reshape(6, 3)[hot])   # read back


def _csr(rng, n, d, nnz):
    """A Zipf-like CSR set: feature f drawn with weight 1 / (f + 1)."""
    weights = 1.0 / np.arange(1, d + 1)
    rows = [np.unique(rng.choice(d, size=nnz, p=weights / weights.sum())) for _ in range(n)]
    indptr = np.concatenate([[0], np.cumsum([r.size for r in rows])]).astype(np.int64)
    indices = np.concatenate(rows).astype(np.int32)
    return indptr, indices, rng.random(indices.size).astype(np.float32), \
        rng.integers(0, 4, n).astype(np.int32)


@pytest.mark.parametrize("hold, lam", [(2, 0.0), (DEFAULT_HOLD, 0.01), (7, 0.01)])
def test_one_worker_holding_hot_rows_steps_as_holding_none_to_rounding(hold, lam):
    # with one worker nothing else writes the held rows, so holding only reorders float32 adds
    # (also with lazy weight decay, whose catch-ups on held rows are held too)
    rng = np.random.default_rng(1)
    n, d, k, batch, steps = 400, 60, 4, 4, 50
    indptr, indices, values, y = _csr(rng, n, d, 8)
    rows = rng.permutation(n)[:batch * steps].astype(np.int64)
    results = []
    for h in (1, hold):
        slot, hot = hot_rows(indices, n, d + 1, batch, h)
        shared = (0.01 * np.arange((d + 1) * k) % 0.07).astype(np.float32)
        count = np.zeros(1, np.int64)
        params, grad = np.zeros_like(shared), np.zeros_like(shared)
        losses, corrects = np.zeros(steps), np.zeros(steps, np.int64)
        staleness = np.full(steps, -1, np.int64)
        out = fused.sparse_steps(
            (shared,), np.array([0, shared.size], np.int64), count, params, grad,
            np.zeros(0, np.int64), indptr, indices, values, y, rows, batch, np.full(steps, 0.5),
            False, np.zeros(d + 1, np.int64), np.zeros(steps + 1), 0, lam, True, False, losses,
            corrects, staleness, slot, hot, h)
        results.append((shared, losses, staleness, count[0], out[4], hot.size))
    (s1, l1, st1, c1, pushed1, _), (s2, l2, st2, c2, pushed2, n_hot) = results
    assert n_hot > 1   # the bias and at least one feature
    assert np.allclose(s1, s2, rtol=1e-5, atol=1e-6) and not np.isnan(s2).any()
    assert np.allclose(l1, l2, rtol=1e-5)
    assert c1 == c2 == steps and (st1 == 0).all() and (st2 == 0).all()
    assert pushed2 < pushed1   # held rows are added once per settle, not every step


def test_hot_touch_goes_from_the_plan_to_the_sparse_workers_choice_of_rows(tmp_path):
    """--hot-touch F reaches SparseUpdates as the plan's own hot-rows options (ProtocolConfig
    carries them as they are) and picks hot_rows' rows for F; refused out of (0, 1) and where
    no rows are held."""
    from types import SimpleNamespace

    from psgd.hogwild.sparse import SparseUpdates
    from psgd.mpi.shardmap import ShardMap
    from psgd.nn.optim import make_optimizer
    from psgd.nn.sparse import build_sparse_model
    from psgd.protocols.features import make_config
    from psgd.run.run_plan import RunPlan, validate
    data = tmp_path / "d.h5"
    data.write_bytes(b"")   # existence is all that validation checks
    flat = dict(data=str(data), protocol="hogwild", model="linear", hot_touch=0.2)
    plan = validate(RunPlan.from_flat(flat))
    model = build_sparse_model("linear:5-2", 5, 2)
    config = make_config("hogwild", model.n_params, hot_rows=plan.hot_rows)
    assert config.hot_rows is plan.hot_rows and plan.as_dict()["hot_touch"] == 0.2
    updates = SparseUpdates(model, ShardMap(model.n_params, 1),
                            make_optimizer("sgd", model.n_params), hot=config.hot_rows)
    indices = np.concatenate([np.zeros(100), np.ones(30), np.full(10, 2), [3]]).astype(np.int32)
    x = SimpleNamespace(indices=indices, indptr=np.arange(101))
    slot, hot, hold = updates.held(x, 4)
    assert hot.tolist() == hot_rows(indices, 100, 6, 4, DEFAULT_HOLD, touch=0.2)[1].tolist()
    assert hot.tolist() == [0, 1, 2, 5] and hold == DEFAULT_HOLD   # 2: touched with 0.34 > 0.2
    with pytest.raises(ValueError, match=r"--hot-touch must be in \(0, 1\), got 1.5"):
        validate(RunPlan.from_flat({**flat, "hot_touch": 1.5}))
    with pytest.raises(ValueError, match="--hot-touch applies with --hold-hot's held rows"):
        validate(RunPlan.from_flat({**flat, "protocol": "asp", "model": "mlp:784-10"}))
