"""Sparse hogwild: only touched rows are accumulated and read, no update lost, lazy decay equal to eager."""
import pytest

SCRIPT = "sparse_hogwild_check.py"


@pytest.mark.parametrize("servers, workers", [(1, 1), (1, 2), (2, 3)])
def test_sparse_hogwild_loses_no_update(mpirun, servers, workers):
    out = mpirun(servers + workers, [SCRIPT, servers, 30, 101, 3], timeout=60).stdout
    assert f"sparse hogwild ok: S={servers} W={workers}" in out


@pytest.mark.parametrize("window, servers, workers", [("shared", 2, 1), ("allocate", 2, 1),
                                                      ("allocate", 1, 2)])
def test_sparse_hogwild_reads_only_its_rows_as_the_servers_hold_them(mpirun, window, servers, workers):
    # two shards of 101 rows of 3 cut mid-row; the check asserts bytes read per step and,
    # with one worker, that the rows read equal the servers' values
    out = mpirun(servers + workers, [SCRIPT, servers, 30, 101, 3], timeout=60,
                 env={"PSGD_X_HOGWILD_WINDOW": window}).stdout
    assert f"sparse hogwild ok: S={servers} W={workers}" in out


def test_sparse_hogwild_lazy_decay_equals_eager(mpirun):
    out = mpirun(3, [SCRIPT, 2, 40, 50, 4, "--decay", "0.1"], timeout=60).stdout
    assert "sparse hogwild ok: S=2 W=1 decay=0.1" in out


@pytest.mark.parametrize("optimizer, servers, workers, extra", [
    ("momentum", 1, 2, []), ("nesterov", 2, 1, ["--decay", "0.05"]),
    ("momentum", 2, 1, ["--decay", "0.05", "--schedule", "cosine"])])
def test_sparse_hogwild_lazy_momentum_equals_eager_and_loses_no_update(mpirun, optimizer, servers,
                                                                       workers, extra):
    # 300 steps: the momentum's products restart twice on the way; the servers' final vector
    # must be each worker's eager momentum trajectory (numpy), summed
    out = mpirun(servers + workers, [SCRIPT, servers, 300, 50, 3, "--optimizer", optimizer, *extra],
                 timeout=90).stdout
    assert f"sparse hogwild ok: S={servers} W={workers}" in out and optimizer in out


@pytest.fixture(scope="module")
def sparse_data(tmp_path_factory):
    from psgd.data.synth_sparse import write_sparse_synthetic
    return str(write_sparse_synthetic(tmp_path_factory.mktemp("sparse") / "s.h5", 4000, 500,
                                      n_features=3000, nnz_per_row=60))


@pytest.mark.parametrize("model, protocol, extra", [
    ("linear", "hogwild", []), ("svm", "hogwild", ["--weight-decay", "1e-4"]),
    ("linear", "asp", ["--compress", "sparse"])])
def test_linear_models_learn_sparse_data_and_move_fewer_bytes(mpirun, sparse_data, tmp_path, model,
                                                              protocol, extra):
    from psgd.run.metrics import read_log
    log = tmp_path / "run.jsonl"
    mpirun(3, ["-m", "psgd", "train", "--data", sparse_data, "--model", model, "--quiet",
               "--protocol", protocol, "--servers", 1, "--lr", 4 if model == "linear" else 0.5,
               "--batch-size", 8, "--epochs", 3, "--log", log, *extra], timeout=180)
    records = read_log(log)
    summary = next(r for r in records if r["kind"] == "summary")
    assert summary["test_accuracy"] > 0.6, summary["test_accuracy"]   # chance: 0.1
    pushed = [r["push_bytes_per_step"] for r in records if r.get("push_bytes_per_step")]
    dense = 4 * 3001 * 10
    assert pushed and max(pushed) < dense / 3, (max(pushed), dense)
    if protocol == "hogwild":   # each step reads its batch's rows only
        pulled = [r["pull_bytes_per_step"] for r in records if r.get("pull_bytes_per_step")]
        assert pulled and max(pulled) < dense / 3, (max(pulled), dense)


def test_sparse_hogwild_checkpoint_mid_run_holds_the_servers_parameters(mpirun, sparse_data, tmp_path):
    # one worker is deterministic: its checkpoint after 60 of 120 steps must equal the final
    # parameters of a 60-step run, though its own copy reads only its batches' rows
    import h5py
    import numpy as np
    common = ["-m", "psgd", "train", "--data", sparse_data, "--model", "linear", "--quiet",
              "--protocol", "hogwild", "--servers", 1, "--lr", 4, "--batch-size", 8]
    mpirun(2, [*common, "--steps", 120, "--checkpoint-dir", tmp_path / "a", "--checkpoint-every", 60],
           timeout=120)
    mpirun(2, [*common, "--steps", 60, "--checkpoint-dir", tmp_path / "b"], timeout=120)
    with h5py.File(tmp_path / "a" / "ckpt-00000060.h5") as a, \
            h5py.File(tmp_path / "b" / "ckpt-00000060.h5") as b:
        assert np.array_equal(a["params"][()], b["params"][()])


@pytest.mark.parametrize("model, extra", [("linear", ["--weight-decay", "1e-3", "--eval-every", 70]),
                                          ("svm", ["--lr-schedule", "cosine"]),
                                          ("linear", ["--optimizer", "adagrad"]),
                                          ("svm", ["--optimizer", "adagrad"])])
def test_runs_of_fused_steps_equal_the_step_by_step_path_bit_for_bit(mpirun, sparse_data, tmp_path,
                                                                     model, extra):
    # one worker on a shared window is deterministic: the runs of steps in one compiled call
    # (psgd/hogwild/fused.py) must log the same losses, bytes and evaluations and leave the
    # same parameters, mid-run and at the end, as the step-by-step path (which holds no rows)
    import h5py
    import numpy as np
    from psgd.run.metrics import read_log
    logs = {}
    for fused in ("on", "off"):
        out = tmp_path / fused
        mpirun(2, ["-m", "psgd", "train", "--data", sparse_data, "--model", model, "--quiet",
                   "--protocol", "hogwild", "--servers", 1, "--lr", 2 if model == "linear" else 0.5,
                   "--batch-size", 8, "--steps", 300, "--log-every", 25, "--log", out / "run.jsonl",
                   "--checkpoint-dir", out, "--checkpoint-every", 100, "--hold-hot", 1, *extra],
               timeout=120,
               env={"PSGD_X_HOGWILD_FUSED": fused})
        logs[fused] = [{k: v for k, v in r.items() if k not in ("samples_per_s", "wall_s", "time")
                        and not k.endswith("_s") and k != "est_global_samples_per_s"}
                       for r in read_log(out / "run.jsonl") if r["kind"] in ("step", "eval")]
    assert logs["on"] == logs["off"]
    assert len([r for r in logs["on"] if r["kind"] == "eval"]) == (5 if "--eval-every" in extra else 1)
    for step in (100, 200, 300):
        name = f"ckpt-{step:08d}.h5"
        with h5py.File(tmp_path / "on" / name) as a, h5py.File(tmp_path / "off" / name) as b:
            assert np.array_equal(a["params"][()], b["params"][()]), name


@pytest.mark.parametrize("hold", [[], ["--hold-hot", 1], ["--hold-hot", 3]])
def test_fused_runs_count_every_update_of_every_worker(mpirun, sparse_data, tmp_path, hold):
    # also with the hot rows held (the default, and 3 steps: runs of 25 steps end mid-hold)
    from psgd.hogwild import DEFAULT_HOLD
    from psgd.run.metrics import read_log
    log = tmp_path / "run.jsonl"
    mpirun(4, ["-m", "psgd", "train", "--data", sparse_data, "--model", "linear", "--quiet",
               "--protocol", "hogwild", "--servers", 1, "--lr", 2, "--batch-size", 8,
               "--steps", 200, "--log-every", 25, "--log", log, *hold], timeout=120)
    records = read_log(log)
    summary = next(r for r in records if r["kind"] == "summary")
    assert sum(summary["staleness_histogram"]) == 3 * 200
    assert summary["test_accuracy"] > 0.3, summary["test_accuracy"]
    config = next(r for r in records if r["kind"] == "config")
    assert config["hold_hot"] == (hold[1] if hold else DEFAULT_HOLD)


def test_a_hogwild_server_never_loads_numba(mpirun, sparse_data, tmp_path):
    # the server only hosts its shard: numba (about 0.2 s of CPU to import) is the workers'
    out = mpirun(3, ["server_imports_check.py", "train", "--data", sparse_data, "--model", "linear",
                     "--quiet", "--protocol", "hogwild", "--servers", 1, "--steps", 20,
                     "--log", tmp_path / "run.jsonl"], timeout=120).stdout
    assert "rank 0 server: numba not loaded" in out, out
    assert "rank 1 worker: numba loaded" in out and "rank 2 worker: numba loaded" in out, out


def test_lazy_momentum_training_equals_dense_hogwild_and_pushes_by_nonzeros(mpirun, sparse_data,
                                                                             tmp_path):
    # one worker: the lazy Nesterov steps (weight decay, cosine schedule, amom) must leave the
    # parameters and velocity of dense hogwild's eager steps, mid-run and at the end, to float
    # tolerance, while each step pushes by the batch's nonzeros (the data: 60 per row)
    import h5py
    import numpy as np
    from psgd.run.metrics import read_log
    pushed = {}
    for sparse in ("on", "off"):
        out = tmp_path / sparse
        mpirun(2, ["-m", "psgd", "train", "--data", sparse_data, "--model", "linear", "--quiet",
                   "--protocol", "hogwild", "--servers", 1, "--optimizer", "nesterov", "--lr", 0.5,
                   "--weight-decay", 1e-4, "--lr-schedule", "cosine", "--staleness-comp", "amom",
                   "--batch-size", 8, "--steps", 300, "--log", out / "run.jsonl",
                   "--checkpoint-dir", out, "--checkpoint-every", 150], timeout=120,
               env={"PSGD_X_HOGWILD_SPARSE": sparse})
        pushed[sparse] = [r["push_bytes_per_step"] for r in read_log(out / "run.jsonl")
                          if r["kind"] == "step" and r.get("push_bytes_per_step")]
    for step in (150, 300):
        name = f"ckpt-{step:08d}.h5"
        with h5py.File(tmp_path / "on" / name) as a, h5py.File(tmp_path / "off" / name) as b:
            for key in ("params", "optimizer/velocity"):
                np.testing.assert_allclose(a[key][()], b[key][()], rtol=1e-5, atol=2e-5, err_msg=key)
    n, k = 3001 * 10, 10
    rows_bound = (8 * 60 + 1) * k * 8 + n * 8 / 100   # the batch's rows, and the restarts' share
    assert pushed["off"] and min(pushed["off"]) == n * 4
    assert pushed["on"] and max(pushed["on"]) < rows_bound, (max(pushed["on"]), rows_bound)


def _decay_problem(seed=3, n=64, d=40, k=3, nnz=4, batch=2, steps=80):
    """A random CSR set (features skewed, so rows miss many steps), its batches' rows and lrs."""
    import numpy as np
    from psgd.data.csr import CSRBatch
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, d + 1)
    indices = np.concatenate([np.sort(rng.choice(d, nnz, replace=False, p=p / p.sum())) for _ in range(n)])
    x = CSRBatch(np.arange(0, n * nnz + 1, nnz, dtype=np.int64), indices.astype(np.int32),
                 rng.uniform(0.5, 1.5, n * nnz).astype(np.float32), d)
    y = rng.integers(0, k, n).astype(np.int64)
    rows = np.concatenate([rng.permutation(n) for _ in range(-(-steps * batch // n))])[:steps * batch]
    lrs = 0.6 * (1 + np.cos(np.pi * np.arange(steps) / steps)) / 2 + 0.05
    w0 = rng.normal(0, 1, (d + 1) * k).astype(np.float32)
    return x, y, rows.astype(np.int64), lrs, w0, batch


def _eager_decayed_sgd(x, y, rows, lrs, w0, batch, lam):
    """Plain numpy: softmax regression, every row scaled by 1 - lr * lam at every step (float64)."""
    import numpy as np
    d, k = x.n_features, len(w0) // (x.n_features + 1)
    dense = np.zeros((len(x), d))
    for i in range(len(x)):
        dense[i, x.indices[x.indptr[i]:x.indptr[i + 1]]] = x.values[x.indptr[i]:x.indptr[i + 1]]
    w = w0.astype(np.float64).reshape(d + 1, k)
    for t, lr in enumerate(lrs):
        b = rows[t * batch:(t + 1) * batch]
        scores = dense[b] @ w[:d] + w[d]
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(b)), y[b]] -= 1
        g = np.vstack([dense[b].T @ p, p.sum(axis=0)]) / len(b)
        w = (1 - lr * lam) * w - lr * g
    return w.ravel()


class _OneShard:
    """A shared window's worker view in one process: one float32 shard, read by plain loads."""

    def __init__(self, w0):
        self.shards, self.params = [w0.copy()], self

    def Sync(self):
        pass


def test_lazy_weight_decay_takes_each_gradient_at_the_decayed_rows(sparse_lam=0.05):
    # the gradient depends on the parameters: each row read must be caught up on its missed decay
    # before the forward pass, in the step-by-step path and in the runs of steps alike
    import numpy as np
    from psgd.hogwild.fused import sparse_steps
    from psgd.hogwild.sparse import SparseUpdates
    from psgd.mpi.shardmap import ShardMap
    from psgd.nn.lazy_decay import LazyDecaySGD
    from psgd.nn.optim import make_optimizer
    from psgd.nn.sparse import build_sparse_model
    x, y, rows, lrs, w0, batch = _decay_problem()
    lam, d, k, n = sparse_lam, x.n_features, 3, len(w0)
    eager = _eager_decayed_sgd(x, y, rows, lrs, w0, batch, lam)
    # step by step, as HogwildWorker.before_batch and step take them
    model = build_sparse_model(f"linear:{d}-{k}", d, k)
    updates = SparseUpdates(model, ShardMap(n, 1), make_optimizer("sgd", n, weight_decay=lam))
    window, params = _OneShard(w0), model.params
    params[:] = w0
    for t, lr in enumerate(lrs):
        xb, yb = x[rows[t * batch:(t + 1) * batch]], y[rows[t * batch:(t + 1) * batch]]
        read = model.rows_of(xb)
        updates.read(window, None, params, read)
        updates.before_batch(params, read)
        model.loss_and_grad(xb, yb)
        updates.accumulate(window, None, *updates.delta(params, model.grad, lr))
    params[:] = window.shards[0]
    updates.accumulate(window, None, *updates.catch_up(params))
    stepwise = window.shards[0]
    # runs of steps (two runs, as psgd/hogwild/fused.py takes them)
    sgd, shard, count = LazyDecaySGD(d + 1, k, lam), w0.copy(), np.zeros(1, np.int64)
    sgd.reserve(len(lrs), lrs.max())
    params, grad, prev = w0.copy(), np.zeros(n, np.float32), np.zeros(0, np.int64)
    for lo, hi in ((0, 30), (30, len(lrs))):
        m = hi - lo
        done, status, _, _, _, prev = sparse_steps(
            (shard,), np.array([0, n], np.int64), count, params, grad, prev, x.indptr, x.indices,
            x.values, y, rows[lo * batch:hi * batch], batch, lrs[lo:hi], False, sgd.last, sgd.logs,
            sgd.t, lam, True, False, np.zeros(m), np.zeros(m, np.int64), np.zeros(m, np.int64),
            np.full(d + 1, -1, np.int64), np.zeros(0, np.int64), 1)   # no rows held
        assert (done, status) == (m, 0)
        sgd.t += m
    shard += sgd.catch_up(shard.copy().reshape(d + 1, k)).ravel()
    np.testing.assert_allclose(stepwise, eager, rtol=1e-4, atol=2e-5)
    np.testing.assert_array_equal(shard, stepwise)
    assert np.abs(eager - _eager_decayed_sgd(x, y, rows, lrs, w0, batch, 0.0)).max() > 0.1
