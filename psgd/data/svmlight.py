"""The svmlight / libsvm text format (``label idx:val ...``) read into the sparse CSR layout."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from psgd.data import csr, layout


def read_svmlight(path: str | os.PathLike) -> tuple[list, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Parse one svmlight file.

    Returns
    -------
    labels : list of int, one per row
    indptr : (N + 1,) int64
    indices : (nnz,) int64, as written in the file (0- or 1-based)
    values : (nnz,) float32
    lines : (N,) int64, the 1-based line number of each row (for error messages)

    Raises
    ------
    ValueError
        Naming the file and line of the first malformed line.
    """
    p = layout.check_input_file(path, "svmlight file")
    labels, indptr, indices, values, lines = [], [0], [], [], []
    with open(p, "rb") as f:
        for number, raw in enumerate(f, 1):
            text = raw.split(b"#", 1)[0].strip()
            if not text:
                continue
            tokens = text.split()
            labels.append(_label(tokens[0], p, number))
            last = -1
            for token in tokens[1:]:
                if token.startswith(b"qid:"):
                    continue
                index, sep, value = token.partition(b":")
                try:
                    j, v = int(index), float(value)
                except ValueError:
                    j, v, sep = -1, 0.0, b""
                if not sep or j < 0:
                    raise ValueError(f"{p}: line {number}: expected 'index:value' with a non-negative "
                                     f"integer index, got {token.decode(errors='replace')!r}")
                if j <= last:
                    raise ValueError(f"{p}: line {number}: feature indices must increase, got {j} after {last}")
                if not np.isfinite(v):
                    raise ValueError(f"{p}: line {number}: feature {j} has non-finite value {v}")
                last = j
                indices.append(j)
                values.append(v)
            indptr.append(len(indices))
            lines.append(number)
    if not labels:
        raise ValueError(f"{p}: no samples (every line is empty or a comment)")
    return (labels, np.asarray(indptr, np.int64), np.asarray(indices, np.int64),
            np.asarray(values, np.float32), np.asarray(lines, np.int64))


def _label(token: bytes, p: Path, number: int) -> int:
    try:
        value = float(token)
    except ValueError:
        value = float("nan")
    if not np.isfinite(value) or value != round(value):
        raise ValueError(f"{p}: line {number}: the label must be an integer class, got "
                         f"{token.decode(errors='replace')!r}")
    return int(value)


def convert_svmlight(train: str | os.PathLike, test: str | os.PathLike, output: str | os.PathLike,
                     n_features: int | None = None, index_base: str = "auto", keep_order: bool = False,
                     shuffle_seed: int = 0) -> Path:
    """Convert a train and a test svmlight file into one sparse psgd dataset.

    Parameters
    ----------
    train, test : path-like
        svmlight / libsvm files; labels are any integers, mapped in sorted order to 0..K-1
        (the same map for both files).
    output : path-like
        The HDF5 file to write.
    n_features : int, optional
        Declared number of features (default: the largest index seen, plus one).
    index_base : {"auto", "0", "1"}
        Whether indices start at 0 or 1; ``auto``: 1 unless some index is 0.
    keep_order, shuffle_seed
        Rows are stored shuffled by ``shuffle_seed`` unless ``keep_order``
        (see :func:`psgd.data.csr.write_csr_dataset`).
    """
    layout.check_output_path(output)
    parsed = {"train": read_svmlight(train), "test": read_svmlight(test)}
    names = {"train": Path(train), "test": Path(test)}
    if index_base == "auto":
        base = 0 if any(len(v[2]) and v[2].min() == 0 for v in parsed.values()) else 1
    elif index_base in ("0", "1"):
        base = int(index_base)
    else:
        raise ValueError(f"index base must be auto, 0 or 1, got {index_base!r}")
    if n_features is None:
        n_features = max(int(v[2].max()) + 1 - base if len(v[2]) else 1 for v in parsed.values())
    if n_features < 1:
        raise ValueError(f"number of features must be >= 1, got {n_features}")
    classes = sorted(set(parsed["train"][0]) | set(parsed["test"][0]))
    code = {c: i for i, c in enumerate(classes)}
    splits = {}
    for split, (labels, indptr, indices, values, lines) in parsed.items():
        j = indices - base
        bad = (j < 0) | (j >= n_features)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            row = int(np.searchsorted(indptr, k, side="right")) - 1
            raise ValueError(f"{names[split]}: line {lines[row]}: feature index {int(indices[k])} is "
                             f"outside the {n_features} declared features ({base}-based indices)")
        splits[split] = (csr.CSRBatch(indptr, j.astype(np.int32), values, n_features),
                         np.array([code[c] for c in labels], np.int32))
    source = f"svmlight:{names['train'].name},{names['test'].name}:classes={','.join(map(str, classes))}"
    return csr.write_csr_dataset(output, splits, n_features, len(classes), source=source,
                                 keep_order=keep_order, shuffle_seed=shuffle_seed)
