"""`psgd data text`: TF-IDF rows against a numpy reference and scikit-learn, the split, bad folders."""
import subprocess
import sys

import h5py
import numpy as np
import pytest

from psgd.data.csr import load_rows
from psgd.data.order import shuffle_permutation
from psgd.data.text import convert_text, find_documents

DOCS = {
    "train": {"fruit": ["apple banana apple", "Banana cherry; banana!", "cherry pie and apple pie"],
              "tools": ["hammer nail hammer", "saw and nail", "a hammer, a saw: and an apple"]},
    "test": {"fruit": ["apple apple kiwi"], "tools": ["nail saw saw zebra"]},
}


@pytest.fixture
def corpus(tmp_path):
    for split, classes in DOCS.items():
        for name, docs in classes.items():
            (tmp_path / "c" / split / name).mkdir(parents=True)
            for i, text in enumerate(docs):
                (tmp_path / "c" / split / name / f"{i}.txt").write_text(text)
    return tmp_path / "c"


def _reference(corpus, split):
    """TF-IDF by hand, in the file's row order: smooth idf from the train split, raw counts,
    unit L2 rows; and the labels."""
    import re
    docs = find_documents(corpus)[1]
    texts = {s: [p.read_text() for p, _ in docs[s]] for s in ("train", "test")}
    tok = [re.findall(r"\b\w\w+\b", t.lower()) for t in texts["train"]]
    vocab = sorted({w for doc in tok for w in doc})
    df = np.array([sum(w in doc for doc in tok) for w in vocab], float)
    idf = np.log((1 + len(tok)) / (1 + df)) + 1
    words = [re.findall(r"\b\w\w+\b", t.lower()) for t in texts[split]]
    x = np.array([[doc.count(w) for w in vocab] for doc in words], float) * idf
    return x / np.linalg.norm(x, axis=1, keepdims=True), vocab, idf, [c for _, c in docs[split]]


def test_text_rows_are_the_reference_tfidf_and_the_file_records_how(corpus, tmp_path):
    out = convert_text(corpus, tmp_path / "t.h5")
    for split in ("train", "test"):
        ref, vocab, idf, labels = _reference(corpus, split)
        x, y, attrs = load_rows(out, split, np.arange(len(ref)))
        perm = shuffle_permutation(len(ref), 0, split)     # the file's row i is source row perm[i]
        np.testing.assert_allclose(x.toarray(), ref[perm], rtol=1e-6, atol=1e-7)
        assert list(y) == [labels[i] for i in perm] and sorted(labels) == [0] * len(DOCS[split]["fruit"]) + \
            [1] * len(DOCS[split]["tools"])
    with h5py.File(out) as f:
        assert [v.decode() for v in f["text/vocabulary"][()]] == vocab
        np.testing.assert_allclose(f["text/idf"][()], idf)
        assert f["text"].attrs["norm"] == "l2" and attrs["n_features"] == len(vocab)
        assert [c.decode() for c in f["text/classes"][()]] == ["fruit", "tools"]


def test_text_rows_equal_scikit_learns_tfidf_vectorizer(corpus, tmp_path):
    text = pytest.importorskip("sklearn.feature_extraction.text")
    out = convert_text(corpus, tmp_path / "t.h5")
    docs = find_documents(corpus)[1]
    train, test = ([p.read_text() for p, _ in docs[s]] for s in ("train", "test"))
    vec = text.TfidfVectorizer().fit(train)
    for split, docs in (("train", train), ("test", test)):
        x, _, _ = load_rows(out, split, np.arange(len(docs)))
        perm = shuffle_permutation(len(docs), 0, split)
        np.testing.assert_allclose(x.toarray(), vec.transform(docs).toarray()[perm], rtol=1e-6,
                                   atol=1e-7)


def test_a_folder_of_class_folders_is_split_by_the_seeded_rule(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(200):
            (tmp_path / name / f"{i}.txt").write_text(f"word{i % 7} common{name}")
    names, docs = find_documents(tmp_path, 0.3, seed=0)
    again = find_documents(tmp_path, 0.3, seed=0)[1]
    other = find_documents(tmp_path, 0.3, seed=1)[1]
    assert names == ["a", "b"] and docs == again and docs != other
    assert 90 < len(docs["test"]) < 150   # about 0.3 of 400
    _, y, _ = load_rows(convert_text(tmp_path, tmp_path / "t.h5"), "train",
                        np.arange(len(docs["train"])))
    assert list(y) != sorted(y)   # the file's rows shuffled, not by class
    assert not {p for p, _ in docs["test"]} & {p for p, _ in docs["train"]}


def test_psgd_data_text_on_a_folder_without_class_folders_is_one_line(tmp_path):
    (tmp_path / "loose.txt").write_text("no class folder here")
    proc = subprocess.run([sys.executable, "-m", "psgd", "data", "text", str(tmp_path), "-o",
                           str(tmp_path / "o.h5")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no class folders" in lines[0], proc.stderr
    assert not (tmp_path / "o.h5").exists()
