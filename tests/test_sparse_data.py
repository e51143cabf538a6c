"""Sparse data: the svmlight converter, the CSR layout, the per-worker reader, synth --sparse, bad input."""
import numpy as np
import pytest

from psgd.data import csr, svmlight
from psgd.data.order import shuffle_permutation
from psgd.data.reader import dataset_info
from psgd.data.synth_sparse import make_sparse, write_sparse_synthetic

TRAIN = """# a comment line
3 1:0.5 4:2 7:1.25
-1 2:1   # trailing comment
3 qid:2 1:1 9:-3

7 5:0.5
"""
TEST = "7 1:1 3:1\n-1 9:2\n"


def _files(tmp_path, train=TRAIN, test=TEST):
    a, b = tmp_path / "a.svm", tmp_path / "b.svm"
    a.write_text(train)
    b.write_text(test)
    return a, b


def test_svmlight_converts_one_based_multiclass_into_csr(tmp_path):
    a, b = _files(tmp_path)
    out = svmlight.convert_svmlight(a, b, tmp_path / "s.h5", keep_order=True)
    x, y, attrs = csr.load_rows(out, "train", np.arange(4))
    dense = np.zeros((4, 9), np.float32)
    for r, row in enumerate([{0: .5, 3: 2, 6: 1.25}, {1: 1}, {0: 1, 8: -3}, {4: .5}]):
        for j, v in row.items():
            dense[r, j] = v
    np.testing.assert_array_equal(x.toarray(), dense)
    np.testing.assert_array_equal(y, [1, 0, 1, 2])      # labels -1, 3, 7 in sorted order
    assert attrs["n_features"] == 9 and attrs["n_classes"] == 3
    xt, yt, _ = csr.load_rows(out, "test", np.arange(2))
    np.testing.assert_array_equal(yt, [2, 0])
    assert xt.toarray()[1, 8] == 2
    info = dataset_info(out)
    assert info["sparse"] and info["input_shape"] == (9,) and info["train"]["nnz"] == 7


def test_svmlight_zero_based_and_declared_features(tmp_path):
    a, b = _files(tmp_path, "1 0:1 3:2\n0 2:1\n", "1 1:1\n")
    out = svmlight.convert_svmlight(a, b, tmp_path / "s.h5", n_features=10, keep_order=True)
    x, _, attrs = csr.load_rows(out, "train", np.arange(2))
    assert attrs["n_features"] == 10
    np.testing.assert_array_equal(x.indices, [0, 3, 2])


@pytest.mark.parametrize("line, words", [
    ("1 3:1 x:2", "line 2: expected 'index:value'"),
    ("1 3:1 2:2", "line 2: feature indices must increase"),
    ("abc 1:1", "line 2: the label must be an integer"),
    ("1 4:nan", "line 2: feature 4 has non-finite value"),
])
def test_svmlight_malformed_line_named_by_number(tmp_path, line, words):
    a, b = _files(tmp_path, "1 1:1\n" + line + "\n")
    with pytest.raises(ValueError, match=words):
        svmlight.convert_svmlight(a, b, tmp_path / "s.h5")
    assert not (tmp_path / "s.h5").exists()


def test_svmlight_index_beyond_declared_features(tmp_path):
    a, b = _files(tmp_path, "1 1:1\n0 2:1 12:1\n")
    with pytest.raises(ValueError, match=r"a.svm: line 2: feature index 12 is outside the 5 declared"):
        svmlight.convert_svmlight(a, b, tmp_path / "s.h5", n_features=5)


@pytest.mark.parametrize("n_workers", [1, 2, 3, 7])
def test_csr_reader_deals_exactly_each_workers_rows(tmp_path, n_workers):
    x, y, xt, yt = make_sparse(50, 10, n_features=300, nnz_per_row=8, seed=3)
    path = write_sparse_synthetic(tmp_path / "s.h5", 50, 10, 300, 10, 8, seed=3)
    stored = shuffle_permutation(50, 0, "train")   # the writer's seeded order (seed 0)
    seen = []
    for k in range(n_workers):
        r = csr.CSRShardReader(path, k, n_workers, batch_size=1, seed=0)
        np.testing.assert_array_equal(r.x.toarray(), x.toarray()[stored[r.rows]])
        np.testing.assert_array_equal(r.y, y[stored[r.rows]])
        seen += list(r.rows)
        bx, by = r.batch(0)
        row = r.order(0)[0]
        np.testing.assert_array_equal(bx.toarray()[0], r.x.toarray()[row])
        assert by[0] == r.y[row]
    assert sorted(seen) == list(range(50))


def test_csr_batch_slices_and_takes_rows():
    x, _, _, _ = make_sparse(20, 1, n_features=100, nnz_per_row=5, seed=1)
    d = x.toarray()
    np.testing.assert_array_equal(x[3:11].toarray(), d[3:11])
    rows = np.array([7, 0, 19, 7])
    np.testing.assert_array_equal(x[rows].toarray(), d[rows])


def test_sparse_synth_is_seeded_and_zipf_shaped():
    a = make_sparse(400, 50, n_features=2000, nnz_per_row=20, seed=5)
    b = make_sparse(400, 50, n_features=2000, nnz_per_row=20, seed=5)
    np.testing.assert_array_equal(a[0].indices, b[0].indices)
    np.testing.assert_array_equal(a[0].values, b[0].values)
    counts = np.sort(np.bincount(a[0].indices, minlength=2000))[::-1]
    assert counts[:20].sum() > 10 * counts[1000:1020].sum()   # a heavy head, a long tail
    assert not np.array_equal(make_sparse(400, 50, 2000, nnz_per_row=20, seed=6)[0].indices, a[0].indices)


def test_synth_sparse_cli_and_info(tmp_path, capsys):
    from psgd.cli import main
    main(["data", "synth", "--sparse", "-o", str(tmp_path / "s.h5"), "--train", "100", "--test", "20",
          "--features", "500", "--nnz", "10"])
    assert "csr float32" in capsys.readouterr().out
    assert dataset_info(tmp_path / "s.h5")["train"]["x_shape"] == (100, 500)


def test_csr_run_rows_are_the_batches_one_after_the_other(tmp_path):
    path = write_sparse_synthetic(tmp_path / "s.h5", 50, 10, 300, 10, 8, seed=3)
    r = csr.CSRShardReader(path, 0, 1, batch_size=4, seed=0)   # 12 steps per epoch
    for step, steps in [(0, 1), (3, 5), (10, 7), (5, 30)]:   # within, across one and two epochs
        expected = np.concatenate([r.order(c // 12)[c % 12 * 4:(c % 12 + 1) * 4]
                                   for c in range(step, step + steps)])
        np.testing.assert_array_equal(r.batch_rows(step, steps), expected)
