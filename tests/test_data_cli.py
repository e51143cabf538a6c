"""`psgd data` from the command line: synth, convert, info, and one-line errors with exit code 1."""
import subprocess
import sys
from pathlib import Path

import numpy as np

from psgd.data import idx

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ["-m", "psgd", "data"]


def _run(*args, cwd):
    return subprocess.run([sys.executable, *ENTRY, *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_synth_then_info(tmp_path):
    r = _run("synth", "-o", tmp_path / "s.h5", "--train", 300, "--test", 50, "--seed", 2, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = _run("info", tmp_path / "s.h5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "(300, 1, 28, 28) uint8" in r.stdout and "10 classes" in r.stdout
    assert "gzip" in r.stdout and "chunks" in r.stdout and "x * 0.00392157" in r.stdout


def test_convert_idx_and_npz(tmp_path):
    rng = np.random.default_rng(0)
    names = ["tri.gz", "trl.gz", "tei", "tel"]
    arrays = [rng.integers(0, 256, (20, 28, 28), dtype=np.uint8), rng.integers(0, 10, 20).astype(np.uint8),
              rng.integers(0, 256, (5, 28, 28), dtype=np.uint8), rng.integers(0, 10, 5).astype(np.uint8)]
    for name, a in zip(names, arrays):
        idx.write_idx(tmp_path / name, a)
    r = _run("convert", "--idx-train-images", "tri.gz", "--idx-train-labels", "trl.gz",
             "--idx-test-images", "tei", "--idx-test-labels", "tel", "-o", "m.h5", "--classes", 10,
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "(20, 1, 28, 28) uint8" in r.stdout
    np.savez(tmp_path / "d.npz", x_train=arrays[0], y_train=arrays[1], x_test=arrays[2], y_test=arrays[3])
    r = _run("convert", "--npz", "d.npz", "-o", "d.h5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def _assert_one_line_error(r, *fragments):
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("psgd: error: "), r.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def test_truncated_idx_is_one_line_error_and_no_output(tmp_path):
    idx.write_idx(tmp_path / "img", np.zeros((4, 28, 28), np.uint8))
    idx.write_idx(tmp_path / "lab", np.zeros(4, np.uint8))
    (tmp_path / "img").write_bytes((tmp_path / "img").read_bytes()[:500])
    r = _run("convert", "--idx-train-images", "img", "--idx-train-labels", "lab",
             "--idx-test-images", "img", "--idx-test-labels", "lab", "-o", "out.h5", cwd=tmp_path)
    _assert_one_line_error(r, "img: truncated IDX file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["img", "lab"]


def test_missing_npz_and_missing_output_dir_are_one_line_errors(tmp_path):
    r = _run("convert", "--npz", "nope.npz", "-o", "out.h5", cwd=tmp_path)
    _assert_one_line_error(r, "nope.npz: npz file does not exist")
    assert list(tmp_path.iterdir()) == []


def test_synth_makes_its_output_folder_on_a_fresh_clone(tmp_path):
    """The Quick start's first step: `psgd data synth -o data/synth.h5` where data/ is missing."""
    r = _run("synth", "-o", "data/synth.h5", "--train", 10, "--test", 10, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "data" / "synth.h5").is_file()


def test_info_on_a_file_missing_a_dataset_is_one_line_error(tmp_path):
    import h5py

    from psgd.data import layout
    x, y = np.zeros((4, 3), np.float32), np.zeros(4, int)
    layout.write_dataset(tmp_path / "d.h5", x, y, x, y)
    with h5py.File(tmp_path / "d.h5", "r+") as f:
        del f["test/y"]
    r = _run("info", "d.h5", cwd=tmp_path)
    _assert_one_line_error(r, "d.h5: missing dataset /test/y")


def test_convert_without_inputs_is_one_line_error(tmp_path):
    r = _run("convert", "--idx-train-images", "a", "-o", "o.h5", cwd=tmp_path)
    _assert_one_line_error(r, "--idx-train-labels")
