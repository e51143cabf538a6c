"""Sparse psgd datasets: CSR per split (indptr, indices, values, y), written, checked and read per worker."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import h5py
import numpy as np

from psgd.atomic_file import atomic_output
from psgd.data import layout, order
from psgd.data.slices import slice_bounds

PARTS = ("indptr", "indices", "values", "y")
DTYPES = {"indptr": np.int64, "indices": np.int32, "values": np.float32, "y": np.int32}
CHUNK = 65536


@dataclass
class CSRBatch:
    """Rows of a sparse matrix: ``indptr`` (B + 1,) int64 from 0, ``indices`` (nnz,) int32,
    ``values`` (nnz,) float32, ``n_features`` columns."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    n_features: int

    def __len__(self) -> int:
        return len(self.indptr) - 1

    @property
    def shape(self) -> tuple[int, int]:
        return len(self), self.n_features

    @property
    def nnz(self) -> int:
        return int(self.indptr[-1])

    def __getitem__(self, rows) -> "CSRBatch":
        """The rows ``rows`` (a slice or an integer array), as a new batch."""
        if isinstance(rows, slice):
            lo, hi, step = rows.indices(len(self))
            if step == 1:
                a, b = self.indptr[lo], self.indptr[max(lo, hi)]
                return CSRBatch(self.indptr[lo:max(lo, hi) + 1] - a, self.indices[a:b],
                                self.values[a:b], self.n_features)
            rows = np.arange(lo, hi, step)
        return take_rows(self, np.asarray(rows, dtype=np.int64))

    def toarray(self) -> np.ndarray:
        """The dense (B, n_features) float32 matrix."""
        out = np.zeros(self.shape, np.float32)
        rows = np.repeat(np.arange(len(self)), np.diff(self.indptr))
        np.add.at(out, (rows, self.indices), self.values)
        return out


def take_rows(x: CSRBatch, rows: np.ndarray) -> CSRBatch:
    """The rows ``rows`` of ``x`` in that order."""
    lengths = x.indptr[rows + 1] - x.indptr[rows]
    indptr = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=indptr[1:])
    pos = np.repeat(x.indptr[rows] - indptr[:-1], lengths) + np.arange(indptr[-1])
    return CSRBatch(indptr, x.indices[pos], x.values[pos], x.n_features)


def is_sparse(path: str | os.PathLike) -> bool:
    """Whether ``path`` is an HDF5 file in the sparse (CSR) layout."""
    p = Path(path)
    if not (p.is_file() and h5py.is_hdf5(p)):
        return False
    try:
        f = h5py.File(p, "r")
    except OSError:
        return False   # unreadable: the dense path's checks name the file and the cause
    with f:
        return "train/indptr" in f


def write_csr_dataset(path, splits: dict, n_features: int, n_classes: int | None = None,
                      source: str = "", extra=None, keep_order: bool = False,
                      shuffle_seed: int = 0) -> Path:
    """Check and write a sparse dataset atomically.

    Parameters
    ----------
    path : path-like
        Output file.
    splits : dict
        ``{"train": (x, y), "test": (x, y)}`` with ``x`` a :class:`CSRBatch` and ``y`` (N,) integer labels.
    n_features : int
        Number of columns; every index must lie in ``[0, n_features)``.
    n_classes : int, optional
        Default max label + 1.
    extra : callable, optional
        ``extra(f)`` adds to the open file before it is renamed into place.
    keep_order, shuffle_seed
        As for :func:`psgd.data.layout.write_dataset`: rows are stored in a seeded order
        unless ``keep_order``.
    """
    out = layout.check_output_path(path)
    ys = {}
    for split in layout.SPLITS:
        x, y = splits[split]
        check_csr(x, n_features, f"{out}: {split}")
        ys[split] = layout.prepare_y(y, f"{out}: {split} y")
        if len(ys[split]) != len(x):
            raise ValueError(f"{out}: {split} has {len(x)} rows but {len(ys[split])} labels")
        if len(x) == 0:
            raise ValueError(f"{out}: {split} has no samples")
    if n_classes is None:
        n_classes = int(max(ys["train"].max(), ys["test"].max())) + 1
    for split in layout.SPLITS:
        layout.check_labels(ys[split], n_classes, f"{out}: {split} y")
    if not keep_order:
        perms = {s: order.shuffle_permutation(len(ys[s]), shuffle_seed, s) for s in layout.SPLITS}
        splits = {s: (take_rows(splits[s][0], perms[s]), ys[s][perms[s]]) for s in layout.SPLITS}
        ys = {s: splits[s][1] for s in layout.SPLITS}
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(out) as tmp, h5py.File(tmp, "w", track_order=True) as f:
        f.attrs.update({"n_classes": int(n_classes), "n_features": int(n_features), "scale": 1.0,
                        "offset": 0.0, "source": str(source), "format_version": layout.FORMAT_VERSION,
                        **order.order_attrs(keep_order, shuffle_seed)})
        for split in layout.SPLITS:
            x = splits[split][0]
            g = f.create_group(split, track_order=True)
            for name, data in zip(PARTS, (x.indptr, x.indices, x.values, ys[split])):
                data = np.ascontiguousarray(data, DTYPES[name])
                g.create_dataset(name, data=data, chunks=(max(1, min(CHUNK, len(data))),),
                                 compression=layout.COMPRESSION,
                                 compression_opts=layout.COMPRESSION_LEVEL, track_times=False)
        if extra is not None:
            extra(f)
    return out


def check_csr(x: CSRBatch, n_features: int, name: str) -> None:
    """Raise ValueError unless ``x`` is a well-formed CSR matrix with ``n_features`` columns."""
    p = np.asarray(x.indptr)
    if p.ndim != 1 or len(p) < 1 or p[0] != 0 or (np.diff(p) < 0).any() or p[-1] != len(x.indices) \
            or len(x.values) != len(x.indices):
        raise ValueError(f"{name}: indptr must rise from 0 to nnz ({len(x.indices)}) with one value per index")
    if len(x.indices) and (x.indices.min() < 0 or x.indices.max() >= n_features):
        bad = int(np.flatnonzero((x.indices < 0) | (x.indices >= n_features))[0])
        row = int(np.searchsorted(p, bad, side="right")) - 1
        raise ValueError(f"{name}: feature index {int(x.indices[bad])} at row {row} is outside "
                         f"[0, {n_features})")
    if not np.isfinite(x.values).all():
        raise ValueError(f"{name}: values contain NaN or Inf")


def csr_info(path: str | os.PathLike) -> dict:
    """:func:`psgd.data.reader.dataset_info` for a sparse file (``x_dtype`` is ``'csr float32'``)."""
    with _open(path) as f:
        attrs = _attrs(f, path)
        d = attrs["n_features"]
        info = {"path": str(path), **attrs, "input_shape": (d,), "x_dtype": "csr float32", "sparse": True,
                **order.stated_order(f.attrs)}
        for split in layout.SPLITS:
            g = f[split]
            labels = g["y"][()]
            layout.check_labels(labels, attrs["n_classes"], f"{path}: /{split}/y")
            n = len(labels)
            info[split] = {"n": n, "x_shape": (n, d), "x_dtype": f"csr float32, nnz {g['values'].shape[0]}",
                           "y_dtype": str(g["y"].dtype), "chunks": g["values"].chunks,
                           "compression": g["values"].compression,
                           "compression_opts": g["values"].compression_opts,
                           "nnz": int(g["values"].shape[0]),
                           "class_counts": np.bincount(labels, minlength=attrs["n_classes"]).tolist(),
                           "order": order.class_mixing(labels, attrs["n_classes"])}
    return info


def _open(path) -> h5py.File:
    p = layout.check_input_file(path, "dataset file")
    if not h5py.is_hdf5(p):
        raise ValueError(f"{p}: not an HDF5 file")
    f = h5py.File(p, "r")
    for split in layout.SPLITS:
        for part in PARTS:
            if f"{split}/{part}" not in f:
                f.close()
                raise ValueError(f"{p}: missing dataset /{split}/{part} of the sparse layout")
        if f[split]["indptr"].shape[0] != f[split]["y"].shape[0] + 1:
            f.close()
            raise ValueError(f"{p}: /{split}/indptr must have one entry more than /{split}/y")
    return f


def _attrs(f: h5py.File, path) -> dict:
    for key in ("n_classes", "n_features"):
        if key not in f.attrs or int(f.attrs[key]) < 1:
            raise ValueError(f"{path}: sparse dataset needs a positive root attribute '{key}'")
    source = f.attrs.get("source", "")
    return {"n_classes": int(f.attrs["n_classes"]), "n_features": int(f.attrs["n_features"]),
            "scale": 1.0, "offset": 0.0, "channel_mean": None, "channel_std": None,
            "format_version": int(f.attrs.get("format_version", 1)),
            "source": source.decode() if isinstance(source, bytes) else str(source)}


def _range(g, indptr: np.ndarray, lo: int, hi: int, n_features: int) -> CSRBatch:
    """Rows ``[lo, hi)`` of the open split ``g`` whose whole indptr is ``indptr``."""
    a, b = int(indptr[lo]), int(indptr[hi])
    return CSRBatch(indptr[lo:hi + 1] - a, g["indices"][a:b].astype(np.int32),
                    g["values"][a:b].astype(np.float32), n_features)


def concat(parts: list, n_features: int) -> CSRBatch:
    """The rows of the batches ``parts``, one after the other."""
    if not parts:
        return CSRBatch(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32), n_features)
    offsets = np.cumsum([0] + [p.nnz for p in parts[:-1]])
    indptr = np.concatenate([[0]] + [p.indptr[1:] + o for p, o in zip(parts, offsets)]).astype(np.int64)
    return CSRBatch(indptr, np.concatenate([p.indices for p in parts]),
                    np.concatenate([p.values for p in parts]), n_features)


def load_rows(path, split: str, rows: np.ndarray) -> tuple[CSRBatch, np.ndarray, dict]:
    """The sorted ``rows`` of ``split``, read a block of rows at a time (only blocks that
    hold one): (x, y int64, attributes)."""
    rows = np.asarray(rows, np.int64)
    with _open(path) as f:
        attrs = _attrs(f, path)
        g, d = f[split], attrs["n_features"]
        indptr = g["indptr"][()].astype(np.int64)
        n, step, parts, start = len(indptr) - 1, layout.WRITE_ROWS, [], 0
        for lo in range(0, n, step):
            end = int(np.searchsorted(rows, lo + step))
            if end > start:
                block = _range(g, indptr, lo, min(lo + step, n), d)
                parts.append(take_rows(block, rows[start:end] - lo))
            start = end
        x = concat(parts, d)
        y = g["y"][()][rows].astype(np.int64)
    check_csr(x, attrs["n_features"], f"{path}: /{split} ({len(rows)} rows read)")
    return x, y, attrs


class CSRShardReader:
    """The sparse /train rows dealt to a worker, batched like :class:`psgd.data.reader.ShardReader`.

    Same constructor, attributes and methods (``order``, ``epoch``, ``batch``,
    ``calibration_rows``, ``test_set``); a batch's ``x`` is a :class:`CSRBatch`.
    """

    rows_in_runs = True   # :meth:`batch_rows` gives the rows of a run of batches at once

    def __init__(self, path, worker: int, n_workers: int, batch_size: int, seed: int = 0,
                 deal: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        self.path, self.worker, self.n_workers = str(path), int(worker), int(n_workers)
        self.batch_size, self.seed = int(batch_size), int(seed)
        with _open(path) as f:
            self.n_train = int(f["train/y"].shape[0])
        self.rows = order.worker_rows(self.n_train, self.worker, self.n_workers, self.seed, deal)
        self.x, self.y, attrs = load_rows(path, "train", self.rows)
        self.n_local = len(self.y)
        self.n_classes, self.n_features = attrs["n_classes"], attrs["n_features"]
        self.input_shape = (self.n_features,)
        if self.n_local < self.batch_size:
            raise ValueError(f"{path}: worker {self.worker} of {self.n_workers} has {self.n_local} "
                             f"training rows, fewer than batch size {self.batch_size}")
        self.steps_per_epoch = self.n_local // self.batch_size
        self._order_epoch, self._order = -1, np.arange(0)

    def order(self, epoch: int) -> np.ndarray:
        """The shuffled local row order of ``epoch``, fixed by (seed, worker, epoch)."""
        if epoch != self._order_epoch:
            self._order = np.random.default_rng([self.seed, self.worker, int(epoch)]).permutation(self.n_local)
            self._order_epoch = int(epoch)
        return self._order

    def batch(self, step: int) -> tuple[CSRBatch, np.ndarray]:
        """The batch of global step ``step``: (CSRBatch of batch_size rows, y int64)."""
        rows = self.batch_rows(step)
        return take_rows(self.x, rows), self.y[rows]

    def batch_rows(self, step: int, steps: int = 1) -> np.ndarray:
        """The rows of :attr:`x` that make the batches of global steps ``step`` to
        ``step + steps - 1``, one after the other (int64, in order)."""
        parts, end, b = [], int(step) + steps, self.batch_size
        while step < end:   # one slice of the shuffled order per epoch the steps reach
            e, i = divmod(int(step), self.steps_per_epoch)
            n = min(end - step, self.steps_per_epoch - i)
            parts.append(self.order(e)[i * b:(i + n) * b])
            step += n
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def epoch(self, e: int) -> Iterator[tuple[CSRBatch, np.ndarray]]:
        """The ``steps_per_epoch`` batches of epoch ``e``."""
        for i in range(self.steps_per_epoch):
            yield self.batch(e * self.steps_per_epoch + i)

    def calibration_rows(self, n: int) -> tuple[CSRBatch, np.ndarray]:
        """``min(n, n_local)`` of this worker's rows drawn at random by (seed, worker)."""
        pick = order.calibration_sample(self.n_local, n, self.seed, self.worker)
        return self.x[pick], self.y[pick]

    def test_set(self, worker: int = 0, n_workers: int = 1) -> tuple[CSRBatch, np.ndarray]:
        """This evaluator's contiguous slice of /test."""
        with _open(self.path) as f:
            n = int(f["test/y"].shape[0])
        x, y, _ = load_rows(self.path, "test", np.arange(*slice_bounds(n, worker, n_workers)))
        return x, y

    def __repr__(self) -> str:
        return (f"CSRShardReader({self.path!r}, worker={self.worker}, n_workers={self.n_workers}, "
                f"{self.n_local} of {self.n_train} rows, batch_size={self.batch_size})")
