"""A seeded sparse classification set with Zipf-distributed feature frequencies (the shape of text data)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from psgd.data import csr

ZIPF_S = 1.1            # feature frequency ~ rank^-s
INFORMATIVE = 0.05      # share of a row's features drawn from its class's own features
CLASS_FEATURES = 200    # features that belong to each class
TASK_SEED = 20240602    # fixes the task (class features, weights); `seed` fixes the samples


def make_sparse(n_train: int, n_test: int, n_features: int = 20000, n_classes: int = 10,
                nnz_per_row: int = 40, seed: int = 0) -> tuple:
    """Generate (x_train, y_train, x_test, y_test) with CSR ``x``; the same ``seed`` gives the same arrays.

    Each row has ``nnz_per_row`` distinct features (fewer after collisions): most
    are drawn from a Zipf(1.1) distribution over all features shared by the classes,
    a twentieth from the row's class's own features (themselves Zipf-ranked); values are
    tf-idf-like, positive and normalised to unit length per row.
    """
    if min(n_train, n_test) < 1 or n_classes < 2 or n_features < n_classes or nnz_per_row < 1:
        raise ValueError(f"sparse synth needs train, test >= 1, classes >= 2, features >= classes and "
                         f"nnz >= 1, got train={n_train} test={n_test} classes={n_classes} "
                         f"features={n_features} nnz={nnz_per_row}")
    task = np.random.default_rng(TASK_SEED)
    own = np.stack([task.choice(n_features, size=min(CLASS_FEATURES, n_features), replace=False)
                    for _ in range(n_classes)])
    ranks = task.permutation(n_features)           # which feature is the k-th most frequent
    p = 1.0 / np.arange(1, n_features + 1) ** ZIPF_S
    p /= p.sum()
    q = 1.0 / np.arange(1, own.shape[1] + 1) ** ZIPF_S
    q /= q.sum()
    out = []
    for part, n in enumerate((n_train, n_test)):
        rng = np.random.default_rng([int(seed), part])
        y = rng.integers(0, n_classes, size=n).astype(np.int32)
        k_own = max(1, int(round(nnz_per_row * INFORMATIVE)))
        common = ranks[rng.choice(n_features, size=(n, nnz_per_row - k_own), p=p)]
        mine = own[y[:, None], rng.choice(own.shape[1], size=(n, k_own), p=q)]
        cols = np.sort(np.concatenate([common, mine], axis=1), axis=1)
        keep = np.ones(cols.shape, bool)
        keep[:, 1:] = cols[:, 1:] != cols[:, :-1]
        lengths = keep.sum(axis=1)
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=indptr[1:])
        values = rng.uniform(0.5, 1.5, size=int(indptr[-1])).astype(np.float32)
        rows = np.repeat(np.arange(n), lengths)
        norms = np.sqrt(np.bincount(rows, values.astype(np.float64) ** 2, minlength=n))
        values = (values / norms[rows]).astype(np.float32)
        out += [csr.CSRBatch(indptr, cols[keep].astype(np.int32), values, n_features), y]
    return tuple(out)


def write_sparse_synthetic(path: str | os.PathLike, n_train: int = 20000, n_test: int = 4000,
                           n_features: int = 20000, n_classes: int = 10, nnz_per_row: int = 40,
                           seed: int = 0) -> Path:
    """Generate the sparse set and write it to ``path`` in the CSR layout."""
    x_tr, y_tr, x_te, y_te = make_sparse(n_train, n_test, n_features, n_classes, nnz_per_row, seed)
    return csr.write_csr_dataset(path, {"train": (x_tr, y_tr), "test": (x_te, y_te)}, n_features,
                                 n_classes, source=f"synth-sparse:seed={seed}")
