"""Data order: converters shuffle a class-sorted source, `data info` flags clustered rows, the
reader deals rows so no worker's classes depend on the file's order, and batch-norm
calibration takes a seeded sample whose statistics match the whole slice's."""
import subprocess
import sys

import h5py
import numpy as np
import pytest

from psgd.data import csr, layout, order
from psgd.data.reader import ShardReader, dataset_info
from psgd.data.synth_sparse import make_sparse
from psgd.nn.model import build_model


def sorted_arrays(n_per_class, classes, shape=(3, 4, 4), seed=0):
    """Class-sorted uint8 images whose channels' brightness depends on the class."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(classes), n_per_class)
    x = rng.integers(0, 60, (len(y), *shape)) + (y * (190 // max(1, classes - 1)))[:, None, None, None]
    return x.astype(np.uint8), y


def write_sorted(path, n_per_class=100, classes=4, keep_order=True):
    x, y = sorted_arrays(n_per_class, classes)
    xt, yt = sorted_arrays(10, classes, seed=1)
    return layout.write_dataset(path, x, y, xt, yt, n_classes=classes, keep_order=keep_order)


def blocks_are_mixed(y, classes, block=1000):
    """Every full block of ``block`` rows holds every class, none above twice its share."""
    for lo in range(0, len(y) - block + 1, block):
        counts = np.bincount(y[lo:lo + block], minlength=classes)
        if counts.min() == 0 or counts.max() > 2 * block / classes:
            return False
    return True


def test_the_shuffle_is_a_seeded_permutation_different_per_split_and_seed():
    p = order.shuffle_permutation(500, 3, "train")
    np.testing.assert_array_equal(np.sort(p), np.arange(500))
    np.testing.assert_array_equal(p, order.shuffle_permutation(500, 3, "train"))
    assert not np.array_equal(p, order.shuffle_permutation(500, 4, "train"))
    assert not np.array_equal(p, order.shuffle_permutation(500, 3, "test"))
    with pytest.raises(ValueError, match="shuffle seed must be >= 0"):
        order.shuffle_permutation(5, -1, "train")


def test_a_converted_class_sorted_tree_mixes_every_1000_row_block(tmp_path):
    """Must show: 10 classes of 400 tiny PNGs each, sorted by folder; every 1,000-row block of the
    converted /train holds every class and none above twice its share (and --keep-order not)."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    for split, n in (("train", 400), ("test", 5)):
        for c in range(10):
            d = tmp_path / "tree" / split / f"class{c}"
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (2, 2), dtype=np.uint8), "L").save(d / f"{i}.png")
    from psgd.data.images import convert_image_tree
    shuffled = convert_image_tree(tmp_path / "tree", tmp_path / "s.h5")
    kept = convert_image_tree(tmp_path / "tree", tmp_path / "k.h5", keep_order=True)
    with h5py.File(shuffled) as f, h5py.File(kept) as g:
        y, y_kept = f["train/y"][()], g["train/y"][()]
        assert f.attrs["row_order"] == "shuffled" and g.attrs["row_order"] == "source"
    assert len(y) == 4000 and blocks_are_mixed(y, 10)
    assert not blocks_are_mixed(y_kept, 10)
    assert np.array_equal(np.sort(y), y_kept)
    assert not dataset_info(shuffled)["train"]["order"]["clustered"]
    assert dataset_info(kept)["train"]["order"]["clustered"]


@pytest.mark.parametrize("n, classes", [(400, 4), (3000, 10), (50000, 10), (5000, 100), (200, 10)])
def test_class_mixing_flags_a_sorted_order_and_not_a_shuffled_one(n, classes):
    y = np.repeat(np.arange(classes), n // classes)
    assert order.class_mixing(y, classes)["clustered"]
    for seed in range(3):
        mix = order.class_mixing(np.random.default_rng(seed).permutation(y), classes)
        assert not mix["clustered"] and mix["mixing"] > 0.95, mix
    # two classes alternating in runs of 100 rows: clustered at 1,000-row blocks? no, mixed
    runs = np.tile(np.repeat([0, 1], 100), 50)
    assert not order.class_mixing(runs, 2)["clustered"]


def test_data_info_warns_about_a_sorted_file_and_not_a_shuffled_one(tmp_path):
    for name, keep, warned in (("sorted.h5", True, True), ("shuffled.h5", False, False)):
        path = write_sorted(tmp_path / name, keep_order=keep)
        r = subprocess.run([sys.executable, "-m", "psgd", "data", "info", str(path)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert "class mixing" in r.stdout
        assert ("warning: /train rows are clustered by class" in r.stdout) == warned, r.stdout
        assert ("order: shuffled (shuffle seed 0)" in r.stdout) == (not keep)


@pytest.mark.parametrize("n_workers", [2, 3, 4])
def test_workers_of_a_class_sorted_file_each_get_every_class_in_its_share(tmp_path, n_workers):
    path = write_sorted(tmp_path / "sorted.h5", n_per_class=200, classes=4)
    rows = []
    for k in range(n_workers):
        r = ShardReader(path, k, n_workers, 8, seed=0)
        counts = np.bincount(r.y, minlength=4)
        share = r.n_local / 4
        assert np.all(np.abs(counts - share) < 5 * np.sqrt(share)), counts   # a fair deal
        contiguous = ShardReader(path, k, n_workers, 8, seed=0, deal=False)
        assert (np.bincount(contiguous.y, minlength=4) == 0).any()   # what slicing gave
        rows.append(r.rows)
    np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(800))
    a, b = (ShardReader(path, 0, 2, 8, seed=s).rows for s in (0, 1))
    assert not np.array_equal(a, b)   # the deal follows the seed


def test_the_deal_reads_whole_blocks_and_keeps_only_its_rows(tmp_path):
    x, y = sorted_arrays(1500, 4)   # 6000 rows: several read blocks
    path = layout.write_dataset(tmp_path / "d.h5", x, y, x[:10], y[:10], n_classes=4, keep_order=True)
    r = ShardReader(path, 1, 3, 8, seed=5)
    np.testing.assert_array_equal(r.x, x[r.rows])
    np.testing.assert_array_equal(r.y, y[r.rows])


def test_calibration_rows_are_a_seeded_sample_of_the_workers_rows(tmp_path):
    path = write_sorted(tmp_path / "sorted.h5", n_per_class=200, classes=4)
    r = ShardReader(path, 1, 2, 8, seed=2)
    xa, ya = r.calibration_rows(100)
    xb, yb = r.calibration_rows(100)
    np.testing.assert_array_equal(xa, xb)
    assert len(ya) == 100 and set(ya) == {0, 1, 2, 3}    # the first 100 rows would be one class
    assert len(r.calibration_rows(10 ** 6)[1]) == r.n_local
    pick = order.calibration_sample(r.n_local, 100, 2, 1)
    assert len(set(pick)) == 100


def test_batchnorm_statistics_from_the_sample_match_the_whole_slice(tmp_path):
    """Tolerance: each channel's calibrated mean within 0.1 standard deviations of the whole
    slice's, and its variance within 15%; the first rows of a sorted slice miss both."""
    path = write_sorted(tmp_path / "sorted.h5", n_per_class=1000, classes=4)
    r = ShardReader(path, 0, 2, 8, seed=0)
    model = build_model("conv:6x3:pad1-bn-relu-gap-dense:4", seed=0, input_shape=r.input_shape,
                        n_classes=4)
    stats = {}
    for name, x in (("all", r.calibration_rows(r.n_local)[0]), ("sample", r.calibration_rows(512)[0]),
                    ("first", ShardReader(path, 0, 2, 8, deal=False).x[:512].astype(np.float32) / 255)):
        model.set_calibration(x)
        model.calibrate()
        bn = model.batchnorms[0]
        stats[name] = bn.mean.copy(), bn.var.copy()
    mean, var = stats["all"]
    sd = np.sqrt(var)

    def close(m, v):
        return bool(np.all(np.abs(m - mean) <= 0.1 * sd) and np.all(np.abs(v / var - 1) <= 0.15))

    assert close(*stats["sample"]), (stats["sample"], stats["all"])
    assert not close(*stats["first"])


def test_sparse_files_are_shuffled_by_the_writer_and_dealt_by_the_reader(tmp_path):
    x, y, xt, yt = make_sparse(400, 40, n_features=200, n_classes=4, nnz_per_row=6, seed=1)
    by_class = np.argsort(y, kind="stable")
    sorted_x = csr.take_rows(x, by_class)
    kept = csr.write_csr_dataset(tmp_path / "k.h5", {"train": (sorted_x, y[by_class]), "test": (xt, yt)},
                                 200, 4, keep_order=True)
    shuffled = csr.write_csr_dataset(tmp_path / "s.h5", {"train": (sorted_x, y[by_class]),
                                                         "test": (xt, yt)}, 200, 4)
    assert dataset_info(kept)["train"]["order"]["clustered"]
    assert not dataset_info(shuffled)["train"]["order"]["clustered"]
    rows = []
    for k in range(2):
        r = csr.CSRShardReader(kept, k, 2, 8, seed=0)
        assert (np.bincount(r.y, minlength=4) > 0.15 * r.n_local).all()
        np.testing.assert_array_equal(r.x.toarray(), sorted_x.toarray()[r.rows])
        np.testing.assert_array_equal(r.y, y[by_class][r.rows])
        assert set(r.calibration_rows(60)[1]) == {0, 1, 2, 3}
        rows += list(r.rows)
    assert sorted(rows) == list(range(400))
