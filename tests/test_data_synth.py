"""The synthetic dataset: deterministic, balanced, learnable but not linearly separable."""
import numpy as np
import pytest

from psgd.data import make_synthetic, synth
from psgd.data.reader import ShardReader, dataset_info


@pytest.fixture(scope="module")
def default_set():
    return make_synthetic(12000, 2000, seed=0)


def test_synth_is_deterministic_per_seed_and_differs_across_seeds():
    a, b, c = (make_synthetic(300, 50, s) for s in (4, 4, 5))
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(a[0], c[0])


def test_synth_test_set_does_not_depend_on_train_size():
    _, _, xa, ya = make_synthetic(100, 40, 1)
    _, _, xb, yb = make_synthetic(500, 40, 1)
    np.testing.assert_array_equal(xa, xb)
    np.testing.assert_array_equal(ya, yb)


def test_synth_files_are_byte_identical_for_the_same_seed(tmp_path):
    p1 = synth.write_synthetic(tmp_path / "a.h5", 500, 100, seed=3)
    p2 = synth.write_synthetic(tmp_path / "b.h5", 500, 100, seed=3)
    assert p1.read_bytes() == p2.read_bytes()
    info = dataset_info(p1)
    assert info["input_shape"] == (1, 28, 28) and info["n_classes"] == 10
    assert info["x_dtype"] == "uint8" and info["scale"] == pytest.approx(1 / 255)
    r = ShardReader(p1, 1, 3, batch_size=32)
    x, y = r.batch(0)
    assert x.shape == (32, 1, 28, 28) and 0 <= x.min() and x.max() <= 1


def test_synth_shapes_dtypes_and_class_balance(default_set):
    xtr, ytr, xte, yte = default_set
    assert xtr.shape == (12000, 1, 28, 28) and xtr.dtype == np.uint8
    assert xte.shape == (2000, 1, 28, 28) and ytr.dtype == np.int32
    for y in (ytr, yte):
        frac = np.bincount(y, minlength=10) / len(y)
        assert frac.min() > 0.08 and frac.max() < 0.12
    assert 10 < xtr.mean() < 120          # strokes on a dark, noisy background


def _least_squares_accuracy(xtr, ytr, xte, yte):
    """One-vs-rest linear least squares (ridge 1e-3) on raw pixels plus a bias."""
    def design(x):
        x = x.reshape(len(x), -1) / 255.0
        return np.hstack([x, np.ones((len(x), 1))])
    a, b = design(xtr), design(xte)
    w = np.linalg.solve(a.T @ a + 1e-3 * len(a) * np.eye(a.shape[1]), a.T @ np.eye(10)[ytr])
    return (np.argmax(a @ w, 1) == ytr).mean(), (np.argmax(b @ w, 1) == yte).mean()


def test_synth_is_not_linearly_separable_but_far_above_chance(default_set):
    train_acc, test_acc = _least_squares_accuracy(*default_set)
    assert 0.3 < train_acc < 0.9, train_acc
    assert 0.3 < test_acc < 0.9, test_acc


def test_synth_rejects_bad_sizes():
    with pytest.raises(ValueError, match="at least 1 train"):
        make_synthetic(0, 10, 0)
