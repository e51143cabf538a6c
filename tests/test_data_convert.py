"""Round trips IDX (gzip and raw) and .npz -> HDF5, and every bad-input case of the converters."""
import gzip

import h5py
import numpy as np
import pytest

from psgd.data import idx, layout, npz
from psgd.data.order import shuffle_permutation
from psgd.data.reader import dataset_info


def _mnist_like(rng, n, side=28):
    return rng.integers(0, 256, size=(n, side, side), dtype=np.uint8), rng.integers(0, 10, size=n).astype(np.uint8)


@pytest.fixture
def idx_files(tmp_path):
    """Four IDX files: train gzip-compressed, test raw; returns (paths, arrays)."""
    rng = np.random.default_rng(1)
    xtr, ytr = _mnist_like(rng, 37)
    xte, yte = _mnist_like(rng, 11)
    paths = {"train_images": tmp_path / "train-images-idx3-ubyte.gz",
             "train_labels": tmp_path / "train-labels-idx1-ubyte.gz",
             "test_images": tmp_path / "t10k-images-idx3-ubyte",
             "test_labels": tmp_path / "t10k-labels-idx1-ubyte"}
    for key, arr in zip(paths, (xtr, ytr, xte, yte)):
        idx.write_idx(paths[key], arr)
    return paths, (xtr, ytr, xte, yte)


def _assert_no_output(directory):
    left = [p.name for p in directory.iterdir() if p.suffix in (".h5", ".tmp") or p.name.startswith(".out")]
    assert left == []


def test_idx_gzip_and_raw_round_trip_equals_source_arrays(tmp_path, idx_files):
    paths, (xtr, ytr, xte, yte) = idx_files
    assert paths["train_images"].read_bytes()[:2] == b"\x1f\x8b"
    assert paths["test_images"].read_bytes()[:4] == b"\0\0\x08\x03"
    out = idx.convert_idx(*paths.values(), tmp_path / "mnist.h5")
    tr, te = shuffle_permutation(len(ytr), 0, "train"), shuffle_permutation(len(yte), 0, "test")
    with h5py.File(out, "r") as f:   # stored in the converters' seeded order, which the file names
        assert f["train/x"].shape == (37, 1, 28, 28) and f["train/x"].dtype == np.uint8
        np.testing.assert_array_equal(f["train/x"][:, 0], xtr[tr])
        np.testing.assert_array_equal(f["train/y"][()], ytr[tr])
        np.testing.assert_array_equal(f["test/x"][:, 0], xte[te])
        np.testing.assert_array_equal(f["test/y"][()], yte[te])
        assert f.attrs["row_order"] == "shuffled" and f.attrs["shuffle_seed"] == 0
        assert "permutation" in f.attrs["row_order_origin"]
        assert f["train/x"].compression == "gzip" and f["train/x"].chunks is not None
        assert f.attrs["n_classes"] == max(ytr.max(), yte.max()) + 1
        assert f.attrs["scale"] == pytest.approx(1 / 255) and f.attrs["offset"] == 0
        assert f.attrs["format_version"] == layout.FORMAT_VERSION
        assert "idx:" in f.attrs["source"]
    info = dataset_info(out)
    assert info["input_shape"] == (1, 28, 28)
    assert sum(info["train"]["class_counts"]) == 37


def test_idx_raw_file_named_gz_is_detected_by_magic_bytes_not_suffix(tmp_path):
    x = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    idx.write_idx(tmp_path / "a.idx", x, gz=True)   # gzip without .gz suffix
    np.testing.assert_array_equal(idx.read_idx(tmp_path / "a.idx"), x)
    idx.write_idx(tmp_path / "b.gz", x, gz=False)   # .gz suffix without gzip
    with pytest.raises(ValueError, match="b.gz: named .gz but is not gzip"):
        idx.read_idx(tmp_path / "b.gz")


def test_convert_classes_option_is_stored(tmp_path, idx_files):
    paths, _ = idx_files
    out = idx.convert_idx(*paths.values(), tmp_path / "m.h5", n_classes=12)
    assert dataset_info(out)["n_classes"] == 12


def test_npz_uint8_round_trip_keeps_uint8_and_scale_1_over_255(tmp_path):
    rng = np.random.default_rng(2)
    xtr, ytr = _mnist_like(rng, 20, side=8)
    xte, yte = _mnist_like(rng, 7, side=8)
    np.savez(tmp_path / "d.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    out = npz.convert_npz(tmp_path / "d.npz", tmp_path / "d.h5", keep_order=True)
    with h5py.File(out, "r") as f:
        assert f["train/x"].dtype == np.uint8 and f["train/x"].shape == (20, 1, 8, 8)
        np.testing.assert_array_equal(f["train/x"][:, 0], xtr)
        np.testing.assert_array_equal(f["test/x"][:, 0], xte)
        np.testing.assert_array_equal(f["train/y"][()], ytr)
        np.testing.assert_array_equal(f["test/y"][()], yte)
        assert f.attrs["scale"] == pytest.approx(1 / 255)


def test_npz_float_round_trip_is_float32_scale_1_and_flat_features_stay_flat(tmp_path):
    rng = np.random.default_rng(3)
    xtr, xte = rng.normal(size=(30, 5)), rng.normal(size=(9, 5)).astype(np.float32)
    ytr, yte = rng.integers(0, 3, 30), rng.integers(0, 3, 9)
    np.savez(tmp_path / "f.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    out = npz.convert_npz(tmp_path / "f.npz", tmp_path / "f.h5", n_classes=4, keep_order=True)
    with h5py.File(out, "r") as f:
        assert f["train/x"].dtype == np.float32 and f["train/x"].shape == (30, 5)
        np.testing.assert_array_equal(f["train/x"][()], xtr.astype(np.float32))
        np.testing.assert_array_equal(f["test/x"][()], xte)
        np.testing.assert_array_equal(f["train/y"][()], ytr)
        assert f.attrs["scale"] == 1.0 and f.attrs["n_classes"] == 4
        assert f.attrs["row_order"] == "source" and "shuffle_seed" not in f.attrs
    assert dataset_info(out)["input_shape"] == (5,)


def test_npz_nhwc_is_transposed_to_nchw(tmp_path):
    x = np.arange(2 * 4 * 5 * 3, dtype=np.uint8).reshape(2, 4, 5, 3)
    y = np.array([0, 1])
    np.savez(tmp_path / "c.npz", x_train=x, y_train=y, x_test=x, y_test=y)
    out = npz.convert_npz(tmp_path / "c.npz", tmp_path / "c.h5", nhwc=True)
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["train/x"][()], x.transpose(0, 3, 1, 2))


def test_writing_over_an_existing_file_replaces_it_atomically(tmp_path):
    x, y = np.zeros((4, 3), np.float32), np.arange(4) % 2
    out = tmp_path / "d.h5"
    layout.write_dataset(out, x, y, x, y, source="first")
    layout.write_dataset(out, x + 1, y, x, y, source="second")
    assert dataset_info(out)["source"] == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["d.h5"]


# ---- bad inputs: a clear message naming the file, and no output file left behind ----

def _corrupt(path, data):
    path.write_bytes(data)
    return path


def _convert(paths, out, **kw):
    return idx.convert_idx(paths["train_images"], paths["train_labels"], paths["test_images"],
                           paths["test_labels"], out, **kw)


def test_truncated_raw_idx_is_rejected_and_no_output_left(tmp_path, idx_files):
    paths, _ = idx_files
    raw = paths["test_images"].read_bytes()
    _corrupt(paths["test_images"], raw[:-100])
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte: truncated IDX file .*found"):
        _convert(paths, tmp_path / "out.h5")
    _assert_no_output(tmp_path)


def test_truncated_gzip_idx_is_rejected(tmp_path, idx_files):
    paths, _ = idx_files
    raw = paths["train_images"].read_bytes()
    _corrupt(paths["train_images"], raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=r"train-images-idx3-ubyte.gz: truncated gzip"):
        _convert(paths, tmp_path / "out.h5")
    _assert_no_output(tmp_path)


def test_gzip_stream_holding_a_truncated_idx_is_rejected(tmp_path, idx_files):
    paths, _ = idx_files
    raw = gzip.decompress(paths["train_labels"].read_bytes())
    _corrupt(paths["train_labels"], gzip.compress(raw[:-5]))
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.gz: truncated IDX file"):
        _convert(paths, tmp_path / "out.h5")
    _assert_no_output(tmp_path)


def test_header_only_truncation_is_rejected(tmp_path):
    p = _corrupt(tmp_path / "h", b"\0\0\x08\x03\0\0")
    with pytest.raises(ValueError, match="h: truncated IDX file .header needs 16 bytes"):
        idx.read_idx(p)


def test_trailing_bytes_after_idx_data_are_rejected(tmp_path):
    idx.write_idx(tmp_path / "l", np.arange(5, dtype=np.uint8))
    _corrupt(tmp_path / "l", (tmp_path / "l").read_bytes() + b"xx")
    with pytest.raises(ValueError, match="2 unexpected bytes after the data"):
        idx.read_idx(tmp_path / "l")


def test_wrong_magic_number_is_rejected(tmp_path, idx_files):
    paths, _ = idx_files
    _corrupt(paths["test_labels"], b"\x89PNG\r\n\x1a\n" + b"\0" * 40)
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte: not an IDX file \(magic number 0x89504e47"):
        _convert(paths, tmp_path / "out.h5")
    _assert_no_output(tmp_path)


def test_labels_file_given_as_images_is_rejected(tmp_path, idx_files):
    paths, _ = idx_files
    paths["train_images"], paths["train_labels"] = paths["train_labels"], paths["train_images"]
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.gz: this is an IDX labels file"):
        _convert(paths, tmp_path / "out.h5")
    _assert_no_output(tmp_path)


def test_images_file_given_as_labels_is_rejected(tmp_path, idx_files):
    paths, _ = idx_files
    paths["test_labels"] = paths["test_images"]
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte: this is an IDX images file, expected a labels"):
        _convert(paths, tmp_path / "out.h5")


def test_image_label_count_mismatch_is_rejected(tmp_path, idx_files):
    paths, (_, ytr, _, _) = idx_files
    idx.write_idx(paths["train_labels"], ytr[:-1])
    with pytest.raises(ValueError, match=r"has 37 images but .*train-labels-idx1-ubyte.gz has 36 labels"):
        _convert(paths, tmp_path / "out.h5")
    _assert_no_output(tmp_path)


def test_labels_outside_classes_are_rejected(tmp_path, idx_files):
    paths, (_, ytr, _, _) = idx_files
    with pytest.raises(ValueError, match=r"train-labels-idx1-ubyte.gz: label \d at row \d+ is outside \[0, 5\)"):
        _convert(paths, tmp_path / "out.h5", n_classes=5)
    _assert_no_output(tmp_path)


def test_missing_input_file_is_rejected(tmp_path, idx_files):
    paths, _ = idx_files
    paths["test_images"] = tmp_path / "nope-idx3-ubyte"
    with pytest.raises(ValueError, match=r"nope-idx3-ubyte: IDX file does not exist"):
        _convert(paths, tmp_path / "out.h5")
    _assert_no_output(tmp_path)


def test_missing_output_directory_is_made(tmp_path, idx_files):
    paths, _ = idx_files
    out = _convert(paths, tmp_path / "new" / "deeper" / "out.h5")
    assert out.is_file()


def test_output_under_a_file_is_rejected_before_reading(tmp_path, idx_files):
    paths, _ = idx_files
    (tmp_path / "plain").write_text("x")
    with pytest.raises(ValueError, match=r"plain is not a directory"):
        _convert(paths, tmp_path / "plain" / "sub" / "out.h5")


def test_nan_in_float_npz_is_rejected_and_no_output_left(tmp_path):
    x = np.ones((6, 4), np.float32)
    x[3, 2] = np.nan
    y = np.zeros(6, int)
    np.savez(tmp_path / "n.npz", x_train=np.ones((6, 4)), y_train=y, x_test=x, y_test=y)
    with pytest.raises(ValueError, match=r"n.npz: x_test: contains NaN or Inf .*first at row 3"):
        npz.convert_npz(tmp_path / "n.npz", tmp_path / "out.h5")
    _assert_no_output(tmp_path)


def test_inf_in_float_data_is_rejected_by_write_dataset(tmp_path):
    x = np.ones((3, 2))
    x[0, 0] = np.inf
    with pytest.raises(ValueError, match=r"out.h5: train x: contains NaN or Inf"):
        layout.write_dataset(tmp_path / "out.h5", x, [0, 1, 0], x, [0, 1, 0])
    _assert_no_output(tmp_path)


def test_npz_missing_key_and_length_mismatch_are_rejected(tmp_path):
    x, y = np.zeros((4, 2, 2), np.uint8), np.zeros(4, int)
    np.savez(tmp_path / "k.npz", x_train=x, y_train=y, x_test=x)
    with pytest.raises(ValueError, match=r"k.npz: missing array\(s\) y_test"):
        npz.convert_npz(tmp_path / "k.npz", tmp_path / "out.h5")
    np.savez(tmp_path / "m.npz", x_train=x, y_train=y[:3], x_test=x, y_test=y)
    with pytest.raises(ValueError, match=r"m.npz: x_train has 4 samples but y_train has 3 labels"):
        npz.convert_npz(tmp_path / "m.npz", tmp_path / "out.h5")
    _corrupt(tmp_path / "z.npz", b"not a zip")
    with pytest.raises(ValueError, match=r"z.npz: "):
        npz.convert_npz(tmp_path / "z.npz", tmp_path / "out.h5")
    _assert_no_output(tmp_path)


def test_error_while_writing_leaves_no_temp_file(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(layout, "_create", boom)
    x, y = np.zeros((4, 2), np.float32), np.zeros(4, int)
    with pytest.raises(OSError, match="disk full"):
        layout.write_dataset(tmp_path / "out.h5", x, y, x, y)
    assert list(tmp_path.iterdir()) == []
