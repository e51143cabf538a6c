"""Linear and svm models on CSR batches against dense numpy references; lazy weight decay against eager."""
import numpy as np
import pytest

from psgd.data.csr import CSRBatch
from psgd.data.synth_sparse import make_sparse
from psgd.nn.lazy_decay import LazyDecaySGD
from psgd.nn.sparse import build_sparse_model, check_data_kind

D, K = 300, 4


def _dense_reference(kind, w, b, x, y):
    s = x @ w + b
    n = len(y)
    if kind == "linear":
        e = np.exp(s - s.max(axis=1, keepdims=True))
        p = e / e.sum(axis=1, keepdims=True)
        loss = -np.log(p[np.arange(n), y]).mean()
        ds = p.copy()
        ds[np.arange(n), y] -= 1
        ds /= n
    else:
        masked = s.copy()
        masked[np.arange(n), y] = -np.inf
        rival = masked.argmax(axis=1)
        margin = 1 + s[np.arange(n), rival] - s[np.arange(n), y]
        loss = np.maximum(margin, 0).mean()
        ds = np.zeros_like(s)
        on = margin > 0
        ds[np.arange(n)[on], rival[on]] = 1 / n
        ds[np.arange(n)[on], y[on]] = -1 / n
    return loss, x.T @ ds, ds.sum(axis=0), (s.argmax(axis=1) == y).sum()


@pytest.mark.parametrize("kind", ["linear", "svm"])
def test_sparse_kernels_agree_with_dense_numpy(kind):
    x, y, _, _ = make_sparse(64, 1, n_features=D, n_classes=K, nnz_per_row=12, seed=2)
    model = build_sparse_model(kind, D, K, dtype=np.float64)
    rng = np.random.default_rng(0)
    for trial in range(3):   # several batches: stale gradient rows must be cleared
        model.params[:] = rng.normal(size=model.n_params)
        w = model.params[:-K].reshape(D, K)
        b = model.params[-K:]
        batch = x[trial * 20:trial * 20 + 20]
        loss, correct = model.loss_and_grad(batch, y[trial * 20:trial * 20 + 20])
        ref = _dense_reference(kind, w, b, batch.toarray().astype(np.float64), y[trial * 20:trial * 20 + 20])
        assert loss == pytest.approx(ref[0], rel=1e-6)
        np.testing.assert_allclose(model.grad[:-K].reshape(D, K), ref[1], atol=1e-6)
        np.testing.assert_allclose(model.grad[-K:], ref[2], atol=1e-6)
        assert correct == ref[3]
        touched = set(batch.indices.tolist()) | {D}
        assert set(model.touched.tolist()) == touched
        assert not model.grad.reshape(D + 1, K)[sorted(set(range(D + 1)) - touched)].any()


def test_sparse_model_learns_the_synthetic_set():
    x, y, xt, yt = make_sparse(3000, 500, n_features=2000, nnz_per_row=60, seed=0)
    model = build_sparse_model("linear", 2000, 10)
    for epoch in range(5):
        for s in range(0, 3000, 32):
            model.loss_and_grad(x[s:s + 32], y[s:s + 32])
            model.params[:] -= 8.0 * model.grad
    assert model.evaluate(xt, yt)[1] > 0.7


def test_dense_model_on_sparse_data_and_the_reverse_one_line():
    with pytest.raises(ValueError, match="is sparse \\(CSR\\), but model lenet takes dense"):
        check_data_kind("lenet", False, True, "s.h5")
    with pytest.raises(ValueError, match="model svm takes sparse \\(CSR\\) data, but d.h5 is dense"):
        check_data_kind("svm", True, False, "d.h5")
    with pytest.raises(ValueError, match="takes sparse CSR batches, got ndarray"):
        build_sparse_model("linear", 5, 2).loss_and_grad(np.zeros((2, 5)), np.zeros(2, int))
    with pytest.raises(ValueError, match="takes 9 features and 2 classes, but the data has 5"):
        build_sparse_model("linear:9-2", 5, 2)


def test_lazy_weight_decay_equals_eager_after_sparse_steps():
    rng = np.random.default_rng(7)
    n_rows, k, lam = 30, 3, 0.05
    w0 = rng.normal(size=(n_rows, k))
    eager, lazy = w0.copy(), w0.copy()
    opt = LazyDecaySGD(n_rows, k, lam)
    for t in range(200):
        lr = 0.5 * (1 + np.cos(np.pi * t / 200)) / 2 + 0.01   # a schedule
        rows = np.sort(rng.choice(n_rows, size=rng.integers(0, 5), replace=False)).astype(np.int64)
        g = np.zeros((n_rows, k))
        g[rows] = rng.normal(size=(len(rows), k))
        eager = (1 - lr * lam) * eager - lr * g
        lazy[rows] += opt.step(lazy, g, rows, lr)
        if t % 37 == 0:   # a mid-run catch-up changes nothing about the result
            lazy += opt.catch_up(lazy)
    lazy += opt.catch_up(lazy)
    np.testing.assert_allclose(lazy, eager, rtol=1e-9, atol=1e-12)
    assert not np.allclose(w0, eager)


@pytest.mark.parametrize("nonzeros", [0, 5, 400, 1000])
def test_sparse_push_frame_round_trips_and_is_never_larger_than_float32(nonzeros):
    from psgd.compress import make
    comp = make("sparse")
    rng = np.random.default_rng(nonzeros)
    grad = np.zeros(1000, np.float32)
    grad[rng.choice(1000, nonzeros, replace=False)] = rng.normal(size=nonzeros)
    out = np.zeros(comp.max_bytes(1000), np.uint8)
    size = comp.encode(grad, out)
    assert size == 8 + 4 + (8 * nonzeros if nonzeros < 500 else 4000)
    dst = np.ones(1000, np.float32)
    comp.decode_add(out[:size], dst)
    np.testing.assert_array_equal(dst, grad + 1)
