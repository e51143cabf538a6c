"""`psgd data text`: a folder of class folders of text files into a sparse TF-IDF dataset.

Tokens are runs of two or more word characters, lower-cased (scikit-learn's
``CountVectorizer`` default pattern). The vocabulary (sorted) and the document
frequencies come from the training split only; ``idf = ln((1 + n) / (1 + df)) + 1`` (smooth
idf), ``x = tf * idf`` with raw counts, each row then scaled to unit L2 norm: the defaults
of scikit-learn's ``TfidfVectorizer``. The vocabulary, idf and these choices are stored in
the file under ``/text``.
"""
from __future__ import annotations

import os
import re
import zlib
from collections import Counter
from pathlib import Path

import h5py
import numpy as np

from psgd.data import csr, layout

TOKEN = re.compile(r"(?u)\b\w\w+\b")
SPLITS = ("train", "test")


def tokens(text: str) -> list[str]:
    """The lower-cased tokens of ``text``."""
    return TOKEN.findall(text.lower())


def _class_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


def find_documents(folder: str | os.PathLike, test_fraction: float = 0.3,
                   seed: int = 0) -> tuple[list[str], dict]:
    """(class names, ``{split: [(path, class id), ...]}``, each split in a seeded random order)
    of a folder of class folders.

    ``folder/train/<class>/...`` and ``folder/test/<class>/...`` give the split; otherwise
    ``folder/<class>/...`` is split by a seeded rule: a file goes to test when the crc32 of
    ``"seed:class/relative path"`` modulo 1000 is below ``1000 * test_fraction``.
    """
    root = Path(folder)
    if not root.is_dir():
        raise ValueError(f"{root}: not a folder (psgd data text takes a folder of class folders)")
    if not 0 < test_fraction < 1:
        raise ValueError(f"--test-fraction must be in (0, 1), got {test_fraction}")
    split_given = {p.name for p in _class_folders(root)} == set(SPLITS)
    tops = {s: root / s for s in SPLITS} if split_given else {"train": root}
    names = sorted({c.name for top in tops.values() for c in _class_folders(top)})
    if not names:
        raise ValueError(f"{root}: no class folders (expected {root}/<class>/<file>, or "
                         f"{root}/train/<class>/... and {root}/test/<class>/...)")
    docs = {s: [] for s in SPLITS}
    for label, name in enumerate(names):
        for split, top in tops.items():
            files = _files(top / name) if (top / name).is_dir() else []
            if split_given:
                docs[split] += [(p, label) for p in files]
                continue
            for p in files:
                key = f"{seed}:{name}/{p.relative_to(top / name).as_posix()}".encode()
                side = "test" if zlib.crc32(key) % 1000 < 1000 * test_fraction else "train"
                docs[side].append((p, label))
    for split in SPLITS:
        if not docs[split]:
            raise ValueError(f"{root}: no {split} documents in the class folders")
    return names, docs


def _counts(paths) -> list[Counter]:
    return [Counter(tokens(Path(p).read_text(errors="replace"))) for p in paths]


def tfidf(counts: list[Counter], vocabulary: dict, idf: np.ndarray, n_features: int) -> csr.CSRBatch:
    """The L2-normalised TF-IDF rows of token ``counts`` (tokens outside ``vocabulary`` dropped)."""
    indptr, indices, values = [0], [], []
    for c in counts:
        ids = sorted((vocabulary[t], n) for t, n in c.items() if t in vocabulary)
        row = np.array([n for _, n in ids], np.float64) * idf[[j for j, _ in ids]] if ids else \
            np.zeros(0)
        norm = np.sqrt((row * row).sum())
        if norm > 0:
            row /= norm
        indices += [j for j, _ in ids]
        values.append(row.astype(np.float32))
        indptr.append(len(indices))
    return csr.CSRBatch(np.array(indptr, np.int64), np.array(indices, np.int32),
                        np.concatenate(values) if values else np.zeros(0, np.float32), n_features)


def convert_text(folder: str | os.PathLike, output: str | os.PathLike, test_fraction: float = 0.3,
                 seed: int = 0, min_df: int = 1) -> Path:
    """Vectorise a folder of class folders (see :func:`find_documents`) into a sparse dataset.

    Parameters
    ----------
    folder, output : path-like
    test_fraction, seed : float, int
        The seeded split, where the folder gives none.
    min_df : int
        Keep the tokens of at least this many training documents.
    """
    layout.check_output_path(output)
    if min_df < 1:
        raise ValueError(f"--min-df must be >= 1, got {min_df}")
    names, docs = find_documents(folder, test_fraction, seed)
    counts = {s: _counts(p for p, _ in docs[s]) for s in SPLITS}
    df = Counter(t for c in counts["train"] for t in c)
    terms = sorted(t for t, n in df.items() if n >= min_df)
    if not terms:
        raise ValueError(f"{folder}: the training documents hold no token of 2+ word characters")
    vocabulary = {t: j for j, t in enumerate(terms)}
    n = len(counts["train"])
    idf = np.log((1.0 + n) / (1.0 + np.array([df[t] for t in terms], np.float64))) + 1.0
    splits = {s: (tfidf(counts[s], vocabulary, idf, len(terms)),
                  np.array([label for _, label in docs[s]], np.int32)) for s in SPLITS}
    source = f"text:{Path(folder).name}:classes={','.join(names)}"
    # rows stored in a seeded random order (the writer's), not class by class
    out = csr.write_csr_dataset(output, splits, len(terms), len(names), source=source,
                                extra=lambda f: _write_text_group(f, terms, idf, names, min_df),
                                shuffle_seed=seed)
    return out


def _write_text_group(f: h5py.File, terms: list[str], idf: np.ndarray, names: list[str],
                      min_df: int) -> None:
    g = f.create_group("text")
    g.create_dataset("vocabulary", data=np.array(terms, dtype=h5py.string_dtype()),
                     compression=layout.COMPRESSION)
    g.create_dataset("idf", data=idf)
    g.create_dataset("classes", data=np.array(names, dtype=h5py.string_dtype()))
    g.attrs.update({"token_pattern": TOKEN.pattern, "lowercase": True, "tf": "raw counts",
                    "idf": "ln((1 + n) / (1 + df)) + 1", "norm": "l2", "min_df": int(min_df)})
