"""`psgd data convert INPUT` detects an .npz, an IDX folder, CIFAR-10 batch folders and image trees;
colour synthetic data; worker-side augmentation; one clear line for every bad input."""
import pickle
import subprocess
import sys

import h5py
import numpy as np
import pytest

from psgd.data import idx, layout
from psgd.data.augment import crop_flip
from psgd.data.detect import convert_input, detect
from psgd.data.reader import ShardReader
from psgd.data.synth import make_synthetic


def run_convert(*args, cwd):
    return subprocess.run([sys.executable, "-m", "psgd", "data", "convert", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def read(path):
    with h5py.File(path, "r") as f:
        return f["train/x"][:], f["train/y"][:], f["test/x"][:], f["test/y"][:], dict(f.attrs)


def arrays(shape, n=(12, 4), classes=10, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (n[0], *shape), dtype=np.uint8), rng.integers(0, classes, n[0]),
            rng.integers(0, 256, (n[1], *shape), dtype=np.uint8), rng.integers(0, classes, n[1]))


def test_an_idx_folder_with_fashion_mnist_names_converts_from_its_path(tmp_path):
    xtr, ytr, xte, yte = arrays((28, 28))
    folder = tmp_path / "fashion"
    folder.mkdir()
    for name, a in [("train-images-idx3-ubyte.gz", xtr), ("train-labels-idx1-ubyte.gz", ytr.astype(np.uint8)),
                    ("t10k-images-idx3-ubyte.gz", xte), ("t10k-labels-idx1-ubyte.gz", yte.astype(np.uint8))]:
        idx.write_idx(folder / name, a)
    r = run_convert(folder, "--keep-order", "-o", tmp_path / "f.h5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "idx" in r.stdout and "(12, 1, 28, 28) uint8" in r.stdout
    got = read(tmp_path / "f.h5")
    np.testing.assert_array_equal(got[0][:, 0], xtr)
    np.testing.assert_array_equal(got[3], yte)


def test_an_npz_converts_from_its_path_and_channels_last_arrays_are_warned_about(tmp_path):
    xtr, ytr, xte, yte = arrays((8, 8, 3))
    np.savez(tmp_path / "d.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    r = run_convert("d.npz", "-o", "a.h5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "looks channels-last" in r.stderr and "--nhwc" in r.stderr
    r = run_convert("d.npz", "--nhwc", "--keep-order", "-o", "b.h5", cwd=tmp_path)
    assert r.returncode == 0 and "warning" not in r.stderr
    np.testing.assert_array_equal(read(tmp_path / "b.h5")[0], xtr.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("kind", ["python", "binary"])
def test_a_cifar10_folder_converts_to_3x32x32_uint8(tmp_path, kind):
    folder = tmp_path / f"cifar-10-batches-{kind}"
    folder.mkdir()
    batches = [arrays((3, 32, 32), n=(6, 5), seed=s) for s in range(2)]
    for name, (x, y) in [("data_batch_1", batches[0][:2]), ("data_batch_2", batches[1][:2]),
                         ("test_batch", batches[0][2:])]:
        if kind == "python":
            with open(folder / name, "wb") as f:
                pickle.dump({b"data": x.reshape(len(x), -1), b"labels": list(map(int, y))}, f)
        else:
            rec = np.concatenate([y.astype(np.uint8)[:, None], x.reshape(len(x), -1)], axis=1)
            rec.tofile(folder / f"{name}.bin")
    assert detect(folder) == "cifar10"
    kind_seen, out = convert_input(folder, tmp_path / "c.h5", keep_order=True)
    xtr, ytr, xte, yte, attrs = read(out)
    assert xtr.shape == (12, 3, 32, 32) and xtr.dtype == np.uint8 and attrs["n_classes"] == 10
    np.testing.assert_array_equal(xtr, np.concatenate([batches[0][0], batches[1][0]]))
    np.testing.assert_array_equal(ytr, np.concatenate([batches[0][1], batches[1][1]]))
    np.testing.assert_array_equal(xte, batches[0][2])


def image_tree(root, classes, shape=(6, 5), mode="RGB", n=2, seed=0):
    from PIL import Image
    rng = np.random.default_rng(seed)
    made = {}
    for split in ("train", "test"):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True)
            for i in range(n):
                a = rng.integers(0, 256, (*shape, 3) if mode == "RGB" else shape, dtype=np.uint8)
                Image.fromarray(a, mode).save(d / f"{i}.png")
                made[split, c, i] = a
    return made


def test_an_image_tree_converts_with_classes_in_sorted_folder_order(tmp_path):
    pytest.importorskip("PIL")
    made = image_tree(tmp_path / "imgs", ["dog", "cat"])
    r = run_convert(tmp_path / "imgs", "--keep-order", "-o", tmp_path / "i.h5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    xtr, ytr, xte, yte, attrs = read(tmp_path / "i.h5")
    assert xtr.shape == (4, 3, 6, 5) and attrs["n_classes"] == 2
    np.testing.assert_array_equal(ytr, [0, 0, 1, 1])          # cat, cat, dog, dog
    np.testing.assert_array_equal(xtr[2], made["train", "dog", 0].transpose(2, 0, 1))
    assert "cat,dog" in attrs["source"]
    made = image_tree(tmp_path / "grey", ["a", "b"], mode="L")
    _, out = convert_input(tmp_path / "grey", tmp_path / "g.h5", size=(4, 4))
    assert read(out)[0].shape == (4, 1, 4, 4)


def bad_trees(root):
    image_tree(root / "ok", ["a", "b"])
    (root / "noclass" / "train").mkdir(parents=True)
    (root / "noclass" / "test").mkdir()
    image_tree(root / "empty", ["a"])
    (root / "empty" / "train" / "b").mkdir()
    image_tree(root / "broken", ["a"])
    (root / "broken" / "train" / "a" / "9.png").write_bytes(b"not a png")
    image_tree(root / "extra", ["a"])
    image_tree(root / "extra2", ["z"])
    (root / "extra2" / "test" / "z").rename(root / "extra" / "test" / "z")
    image_tree(root / "sizes", ["a"])
    from PIL import Image
    Image.fromarray(np.zeros((7, 7, 3), np.uint8)).save(root / "sizes" / "train" / "a" / "big.png")
    (root / "nothing").mkdir()
    (root / "partial").mkdir()
    idx.write_idx(root / "partial" / "train-images-idx3-ubyte", np.zeros((2, 4, 4), np.uint8))
    (root / "x.txt").write_text("hi")


@pytest.mark.parametrize("name,message", [
    ("noclass", "noclass/train: no class folders"),
    ("empty", "empty/train/b: class folder holds no images"),
    ("broken", "broken/train/a/9.png: cannot read as an image"),
    ("extra", "extra/test: class folder(s) z are not in"),
    ("sizes", "7x7 pixels, but"),
    ("nothing", "found no IDX files"),
    ("partial", "none for the train labels, test images, test labels"),
    ("x.txt", "a file that is not an .npz"),
    ("missing", "missing: no such file or directory"),
])
def test_bad_input_folders_are_one_line_naming_the_file(tmp_path, name, message):
    pytest.importorskip("PIL")
    bad_trees(tmp_path)
    r = run_convert(tmp_path / name, "-o", tmp_path / "out.h5", cwd=tmp_path)
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert not (tmp_path / "out.h5").exists()


def test_colour_synthetic_data_is_3x32x32_deterministic_and_balanced():
    a = make_synthetic(200, 50, seed=1, channels=3)
    b = make_synthetic(200, 50, seed=1, channels=3)
    assert a[0].shape == (200, 3, 32, 32) and a[0].dtype == np.uint8 and a[2].shape == (50, 3, 32, 32)
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    assert np.bincount(a[1]).tolist() == [20] * 10
    grey = make_synthetic(200, 50, seed=1)
    np.testing.assert_array_equal(grey[1], a[1])               # the same samples, coloured
    assert a[0].reshape(200, 3, -1).std(axis=2).mean(axis=0).min() > 10   # every channel varies


def test_crop_flip_takes_a_window_of_the_padded_image_possibly_mirrored():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 2, 5, 6)).astype(np.float32)
    out = crop_flip(x, np.random.default_rng(3), pad=2)
    padded = np.pad(x, ((0, 0), (0, 0), (2, 2), (2, 2)))
    flips = 0
    for i in range(50):
        windows = [padded[i, :, r:r + 5, s:s + 6] for r in range(5) for s in range(5)]
        plain = any(np.array_equal(out[i], w) for w in windows)
        mirrored = any(np.array_equal(out[i], w[:, :, ::-1]) for w in windows)
        assert plain or mirrored
        flips += mirrored and not plain
    assert 10 < flips < 40
    np.testing.assert_array_equal(crop_flip(x, np.random.default_rng(3), pad=2), out)


def test_the_reader_augments_each_step_the_same_way_and_refuses_vectors(tmp_path):
    x, y, xt, yt = make_synthetic(64, 8, channels=3)
    path = layout.write_dataset(tmp_path / "c.h5", x, y, xt, yt, n_classes=10)
    r1 = ShardReader(path, 0, 2, 16, seed=1, augment=True)
    r2 = ShardReader(path, 0, 2, 16, seed=1, augment=True)
    plain = ShardReader(path, 0, 2, 16, seed=1)
    assert r1.augment == 4
    np.testing.assert_array_equal(r1.batch(5)[0], r2.batch(5)[0])
    assert not np.array_equal(r1.batch(5)[0], plain.batch(5)[0])
    np.testing.assert_array_equal(r1.batch(5)[1], plain.batch(5)[1])
    flat = layout.write_dataset(tmp_path / "v.h5", x.reshape(64, -1), y, xt.reshape(8, -1), yt)
    with pytest.raises(ValueError, match="--augment needs images"):
        ShardReader(flat, 0, 1, 16, augment=True)


def test_colour_data_is_normalised_per_channel_by_the_train_statistics(tmp_path):
    from psgd.data.synth import write_synthetic
    path = write_synthetic(tmp_path / "c.h5", 300, 50, channels=3)
    with h5py.File(path, "r") as f:
        mean, std = f.attrs["channel_mean"], f.attrs["channel_std"]
        raw = f["train/x"][:].astype(np.float64) / 255
    np.testing.assert_allclose(mean, raw.mean(axis=(0, 2, 3)), rtol=1e-9)
    np.testing.assert_allclose(std, raw.std(axis=(0, 2, 3)), rtol=1e-9)
    x, _ = ShardReader(path, 0, 1, 16).calibration_rows(300)
    np.testing.assert_allclose(x.mean(axis=(0, 2, 3)), 0.0, atol=1e-4)
    np.testing.assert_allclose(x.std(axis=(0, 2, 3)), 1.0, atol=1e-4)
    with h5py.File(path, "r+") as f:
        f.attrs["channel_std"] = [1.0, 2.0]
    with pytest.raises(ValueError, match="channel_std must hold 3 finite numbers"):
        ShardReader(path, 0, 1, 16)


def test_two_workers_draw_different_crops_and_flips_at_the_same_step(tmp_path):
    """Each worker augments with its own stream (seed, worker, step): were they the same, two ranks
    would see half the augmentation diversity of one rank over the same samples."""
    x, y, xt, yt = make_synthetic(64, 8, channels=3)
    x[:] = x[0]   # every row the same image: only the draws can tell two batches apart
    path = layout.write_dataset(tmp_path / "c.h5", x, y, xt, yt, n_classes=10)
    w0, w1 = (ShardReader(path, w, 2, 16, seed=1, augment=True) for w in (0, 1))
    for step in (0, 3):
        a, b = w0.batch(step)[0], w1.batch(step)[0]
        same = [np.array_equal(a[i], b[i]) for i in range(16)]
        assert sum(same) < 8, f"step {step}: {sum(same)} of 16 images augmented alike on both workers"
