"""ShardReader: exact per-worker deals of rows, bounded reads, deterministic shuffles; file validation."""
import h5py
import numpy as np
import pytest

from psgd.data import layout
from psgd.data.order import worker_rows
from psgd.data.reader import ShardReader, dataset_info, slice_bounds


def _write(path, n_train=103, n_test=29, shape=(1, 4, 4), dtype=np.uint8, n_classes=7):
    rng = np.random.default_rng(0)
    if dtype == np.uint8:
        xtr = rng.integers(0, 256, (n_train, *shape), dtype=np.uint8)
        xte = rng.integers(0, 256, (n_test, *shape), dtype=np.uint8)
    else:
        xtr = rng.normal(size=(n_train, *shape)).astype(np.float32)
        xte = rng.normal(size=(n_test, *shape)).astype(np.float32)
    ytr, yte = rng.integers(0, n_classes, n_train), rng.integers(0, n_classes, n_test)
    layout.write_dataset(path, xtr, ytr, xte, yte, n_classes=n_classes, source="test", keep_order=True)
    return xtr, ytr, xte, yte


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "d.h5"
    return path, _write(path)


def test_slice_bounds_are_near_equal_and_first_n_mod_w_are_longer():
    assert [slice_bounds(10, k, 4) for k in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(ValueError, match="worker 4 is outside"):
        slice_bounds(10, 4, 4)


@pytest.mark.parametrize("n_workers", range(1, 8))
def test_union_of_worker_slices_is_the_whole_train_set_without_overlap(data, n_workers):
    path, (xtr, ytr, _, _) = data
    readers = [ShardReader(path, k, n_workers, batch_size=1) for k in range(n_workers)]
    assert all(r.n_train == 103 for r in readers)
    sizes = [r.n_local for r in readers]
    assert sum(sizes) == 103 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)
    rows = np.concatenate([r.rows for r in readers])
    np.testing.assert_array_equal(np.sort(rows), np.arange(103))   # each row dealt once
    for r in readers:
        assert (np.diff(r.rows) > 0).all()
        np.testing.assert_array_equal(r.x, xtr[r.rows])
        np.testing.assert_array_equal(r.y, ytr[r.rows])


@pytest.mark.parametrize("deal", [True, False])
def test_reader_holds_only_its_rows_and_a_slice_reads_only_its_slice(tmp_path, monkeypatch, deal):
    path = tmp_path / "big.h5"
    _write(path, n_train=4000, n_test=10, shape=(1, 16, 16))
    reads = []
    original = h5py.Dataset.__getitem__

    def spy(self, key):
        out = original(self, key)
        reads.append((self.name, np.asarray(out).nbytes))
        return out

    monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
    r = ShardReader(path, 2, 5, batch_size=32, deal=deal)
    x_bytes = sum(b for name, b in reads if name == "/train/x")
    assert r.n_local == 800
    # a slice reads exactly its rows, once; a deal reads each block of chunks once
    assert x_bytes == (4000 if deal else 800) * 16 * 16
    assert {name for name, _ in reads} == {"/train/x", "/train/y"}
    assert r.x.nbytes == 800 * 256


def test_reader_memory_stays_near_its_slice_size(tmp_path):
    import tracemalloc
    path = tmp_path / "big.h5"
    _write(path, n_train=8000, n_test=10, shape=(1, 16, 16))
    tracemalloc.start()
    r = ShardReader(path, 0, 8, batch_size=10)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    whole = 8000 * 256
    assert r.n_local == 1000
    assert peak < whole / 2, f"peak {peak} bytes while the whole /train/x is {whole}"


def test_batches_are_float32_scaled_and_int64(data):
    path, (xtr, ytr, _, _) = data
    r = ShardReader(path, 0, 1, batch_size=10, seed=3)
    assert r.input_shape == (1, 4, 4) and r.n_classes == 7 and r.steps_per_epoch == 10
    x, y = r.batch(0)
    assert x.dtype == np.float32 and x.shape == (10, 1, 4, 4) and y.dtype == np.int64
    rows = r.order(0)[:10]
    np.testing.assert_allclose(x, xtr[rows] / np.float32(255), rtol=1e-6)
    np.testing.assert_array_equal(y, ytr[rows])


def test_shuffle_is_deterministic_per_seed_different_per_epoch_and_covers_the_slice(data):
    path, (_, ytr, _, _) = data
    a = ShardReader(path, 1, 3, batch_size=8, seed=5)
    b = ShardReader(path, 1, 3, batch_size=8, seed=5)
    c = ShardReader(path, 1, 3, batch_size=8, seed=6)
    ea = [y for _, y in a.epoch(0)]
    assert len(ea) == a.steps_per_epoch == 34 // 8
    assert all(np.array_equal(u, v) for u, v in zip(ea, (y for _, y in b.epoch(0))))
    assert not np.array_equal(a.order(0), c.order(0))
    assert not np.array_equal(a.order(0), a.order(1))
    assert sorted(a.order(0)) == list(range(a.n_local))
    seen = np.concatenate(ea)  # all but the dropped partial batch, each row once
    assert len(seen) == 32
    np.testing.assert_array_equal(np.sort(seen), np.sort(ytr[a.rows][a.order(0)[:32]]))


def test_batch_by_global_step_matches_epoch_iteration(data):
    path, _ = data
    r = ShardReader(path, 0, 2, batch_size=7, seed=1)
    spe = r.steps_per_epoch
    flat = [xy for e in range(3) for xy in r.epoch(e)]
    for step in (0, 1, spe - 1, spe, 2 * spe + 3, spe + 2, 0):
        x, y = r.batch(step)
        np.testing.assert_array_equal(x, flat[step][0])
        np.testing.assert_array_equal(y, flat[step][1])


def test_workers_shuffle_differently(data):
    path, _ = data
    a, b = ShardReader(path, 0, 2, 4, seed=0), ShardReader(path, 1, 2, 4, seed=0)
    assert not np.array_equal(a.order(0)[:20], b.order(0)[:20])


def test_test_set_slices_cover_the_test_split(data):
    path, (_, _, xte, yte) = data
    r = ShardReader(path, 0, 1, batch_size=4)
    x, y = r.test_set()
    assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape == (29, 1, 4, 4)
    np.testing.assert_allclose(x, xte / np.float32(255), rtol=1e-6)
    parts = [r.test_set(k, 3) for k in range(3)]
    assert [len(p[1]) for p in parts] == [10, 10, 9]
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), yte)


def test_float_data_with_offset_is_scaled(tmp_path):
    path = tmp_path / "f.h5"
    x = np.arange(12, dtype=np.float32).reshape(6, 2)
    layout.write_dataset(path, x, np.arange(6) % 2, x, np.arange(6) % 2, scale=2.0, offset=-1.0,
                         keep_order=True)
    xb, _ = ShardReader(path, 0, 1, batch_size=6).batch(0)
    r = ShardReader(path, 0, 1, batch_size=6)
    np.testing.assert_allclose(xb, x[r.order(0)] * 2 - 1)


def test_fewer_rows_than_batch_size_names_both_numbers(data):
    path, _ = data
    with pytest.raises(ValueError, match=r"worker 6 of 7 has 14 training rows, fewer than batch size 15"):
        ShardReader(path, 6, 7, batch_size=15)


def test_dataset_info_reports_shapes_classes_and_storage(data):
    path, (_, ytr, _, _) = data
    info = dataset_info(path)
    assert info["input_shape"] == (1, 4, 4) and info["n_classes"] == 7
    assert info["train"]["n"] == 103 and info["test"]["n"] == 29
    assert info["train"]["class_counts"] == np.bincount(ytr, minlength=7).tolist()
    assert info["train"]["compression"] == "gzip" and info["train"]["chunks"][0] == 103
    assert info["scale"] == pytest.approx(1 / 255) and info["source"] == "test"


# ---- bad files: the reader and dataset_info name the file and the problem ----

def _edit(path, fn):
    with h5py.File(path, "r+") as f:
        fn(f)


def test_missing_dataset_is_reported(data):
    path, _ = data
    _edit(path, lambda f: f.__delitem__("test/y"))
    for call in (lambda: dataset_info(path), lambda: ShardReader(path, 0, 1, 4)):
        with pytest.raises(ValueError, match=r"d.h5: missing dataset /test/y"):
            call()


def test_mismatched_x_y_lengths_are_reported(data):
    path, _ = data

    def shrink(f):
        y = f["train/y"][:-2]
        del f["train/y"]
        f["train/y"] = y
    _edit(path, shrink)
    with pytest.raises(ValueError, match=r"d.h5: /train/x has 103 rows but /train/y has 101"):
        ShardReader(path, 0, 1, 4)


@pytest.mark.parametrize("attr, value, message", [
    ("n_classes", None, "missing root attribute 'n_classes'"),
    ("scale", "abc", "root attribute 'scale' must be a number"),
    ("n_classes", 0, "n_classes must be a positive integer"),
    ("format_version", 99, "format_version 99 is not supported"),
    ("scale", 0.0, "must be finite with scale non-zero"),
])
def test_wrong_attributes_are_reported(data, attr, value, message):
    path, _ = data

    def change(f):
        if value is None:
            del f.attrs[attr]
        else:
            f.attrs[attr] = value
    _edit(path, change)
    with pytest.raises(ValueError, match="d.h5: .*" + message):
        dataset_info(path)


def test_labels_outside_classes_in_file_are_reported(data):
    path, _ = data
    _edit(path, lambda f: f["train/y"].__setitem__(50, 9))
    with pytest.raises(ValueError, match=r"/train/y: label 9 at row 50 is outside \[0, 7\)"):
        ShardReader(path, 0, 1, 4)
    holder = 0 if 50 in worker_rows(103, 0, 2, seed=0) else 1
    ShardReader(path, 1 - holder, 2, 4)  # the other worker's dealt rows are clean


def test_nan_in_a_workers_slice_is_reported_when_loaded(tmp_path):
    path = tmp_path / "f.h5"
    _write(path, dtype=np.float32)
    _edit(path, lambda f: f["train/x"].__setitem__((60, 0, 1, 1), np.inf))
    holder = 0 if 60 in worker_rows(103, 0, 2, seed=0) else 1
    ShardReader(path, 1 - holder, 2, 4)  # this worker's dealt rows are finite
    with pytest.raises(ValueError, match=r"f.h5: /train/x: contains NaN or Inf .*first at row 60"):
        ShardReader(path, holder, 2, 4)


def test_missing_and_non_hdf5_files_are_reported(tmp_path):
    with pytest.raises(ValueError, match=r"nope.h5: dataset file does not exist"):
        ShardReader(tmp_path / "nope.h5", 0, 1, 1)
    (tmp_path / "text.h5").write_text("hello")
    with pytest.raises(ValueError, match=r"text.h5: not an HDF5 file"):
        dataset_info(tmp_path / "text.h5")


def test_bad_worker_arguments_are_rejected(data):
    path, _ = data
    with pytest.raises(ValueError, match="worker 3 is outside"):
        ShardReader(path, 3, 3, 4)
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        ShardReader(path, 0, 1, 0)
