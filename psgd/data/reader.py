"""Per-worker reading of a psgd HDF5 dataset: each worker loads only the /train rows dealt to it."""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np

from psgd.data import csr, layout, order
from psgd.data.augment import crop_flip
from psgd.data.slices import slice_bounds

READ_ROWS = 4 * layout.CHUNK_ROWS   # rows per read when dealt rows are picked from whole chunks


def dataset_info(path: str | os.PathLike) -> dict:
    """Describe a psgd dataset without reading its samples.

    Returns
    -------
    dict
        ``path``, ``n_classes``, ``scale``, ``offset``, ``channel_mean`` and ``channel_std``
        (lists, or None), ``source``, ``format_version``,
        ``input_shape`` (tuple: (C, H, W) or (D,)), ``x_dtype`` (str) and per split
        (``"train"``, ``"test"``) a dict with ``n``, ``x_shape``, ``x_dtype``,
        ``y_dtype``, ``chunks``, ``compression``, ``class_counts`` (list of
        n_classes ints; labels are read, samples are not) and ``order``
        (:func:`psgd.data.order.class_mixing` of its labels); ``row_order`` and
        ``shuffle_seed``: how the converter ordered the rows (None when it did not say).

    Raises
    ------
    ValueError
        If the file is missing or does not follow the layout.
    """
    if csr.is_sparse(path):
        return csr.csr_info(path)
    with layout.open_checked(path) as f:
        attrs = layout.check_layout(f, path)
        info = {"path": str(path), **attrs, "input_shape": tuple(f["train/x"].shape[1:]),
                "x_dtype": str(f["train/x"].dtype), **order.stated_order(f.attrs)}
        for split in layout.SPLITS:
            x, y = f[split]["x"], f[split]["y"]
            labels = y[()]
            layout.check_labels(labels, attrs["n_classes"], f"{path}: /{split}/y")
            info[split] = {
                "n": int(x.shape[0]), "x_shape": tuple(x.shape), "x_dtype": str(x.dtype),
                "y_dtype": str(y.dtype), "chunks": x.chunks, "compression": x.compression,
                "compression_opts": x.compression_opts,
                "class_counts": np.bincount(labels, minlength=attrs["n_classes"]).tolist(),
                "order": order.class_mixing(labels, attrs["n_classes"]),
            }
    return info


def split_rows(path, split: str) -> int:
    """Rows in ``/split`` of a (checked) dense psgd dataset."""
    with layout.open_checked(path) as f:
        return int(f[split]["x"].shape[0])


def read_rows(ds, rows: np.ndarray) -> np.ndarray:
    """``ds[rows]`` for sorted distinct ``rows``, read a block of whole chunks at a time.

    Only blocks that hold a wanted row are read; memory is the result plus one block.
    """
    rows = np.asarray(rows, np.int64)
    if len(rows) and rows[-1] - rows[0] + 1 == len(rows):   # one contiguous range
        return ds[int(rows[0]):int(rows[-1]) + 1]
    out = np.empty((len(rows), *ds.shape[1:]), ds.dtype)
    step = READ_ROWS
    ends = np.searchsorted(rows, np.arange(step, ds.shape[0] + step, step))
    start = 0
    for b, end in enumerate(ends):
        if end > start:
            lo = b * step
            out[start:end] = ds[lo:min(lo + step, ds.shape[0])][rows[start:end] - lo]
        start = end
    return out


def _load_rows(path, split: str, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, dict]:
    """Read the sorted ``rows`` of ``/split`` (only the blocks that hold them), check them;
    return x (stored dtype), y int64, attrs."""
    with layout.open_checked(path) as f:
        attrs = layout.check_layout(f, path)
        x = read_rows(f[split]["x"], rows)
        y = read_rows(f[split]["y"], rows).astype(np.int64)
    what = f"{path}: /{split}"
    if x.dtype.kind == "f":
        bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if bad.any():
            raise ValueError(f"{what}/x: contains NaN or Inf ({int(bad.sum())} bad samples of the "
                             f"{len(rows)} read, first at row {int(rows[np.flatnonzero(bad)[0]])})")
    bad = (y < 0) | (y >= attrs["n_classes"])
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what}/y: label {int(y[i])} at row {int(rows[i])} is outside "
                         f"[0, {attrs['n_classes']}) ({int(bad.sum())} such labels)")
    return x, y, attrs


def _to_float(x: np.ndarray, attrs: dict) -> np.ndarray:
    """``x * scale + offset`` as float32, then ``(. - channel_mean) / channel_std`` where the file has them."""
    out = x.astype(np.float32)
    scale, offset = attrs["scale"], attrs["offset"]
    if attrs.get("channel_mean") is not None:   # one multiply-add per channel
        mean, std = np.asarray(attrs["channel_mean"]), np.asarray(attrs["channel_std"])
        shape = (len(std),) + (1,) * (x.ndim - 2)
        out *= (scale / std).astype(np.float32).reshape(shape)
        out += ((offset - mean) / std).astype(np.float32).reshape(shape)
        return out
    if scale != 1.0:
        out *= np.float32(scale)
    if offset != 0.0:
        out += np.float32(offset)
    return out


class ShardReader:
    """Worker ``worker`` of ``n_workers``: the /train rows dealt to it, shuffled batches, a /test slice.

    Its rows (:func:`psgd.data.order.worker_rows`: a seeded deal of all rows, the first
    ``n % W`` workers one more) are read once into memory, in file order and their stored
    dtype; the file is not kept open.
    Batches are converted to float32 with the file's ``scale`` and ``offset``.

    Parameters
    ----------
    path : path-like
        A psgd HDF5 dataset.
    worker, n_workers : int
        This worker's index k in [0, W) and W.
    batch_size : int
        Rows per batch; the last partial batch of an epoch is dropped.
    seed : int
        Fixes the deal of rows to workers, and with ``worker`` and the epoch the shuffle order.
    augment : bool
        :meth:`batch` crops each image from its zero padding of H // 8 pixels (at least 1;
        4 for 32x32) and flips it left-right half the time, drawn from (seed, worker,
        step), so a resumed run sees the batches an uninterrupted one saw.
    deal : bool
        False: the contiguous slice ``[lo, hi)`` of /train instead of a deal, which leaves
        each worker's classes to the file's order.

    Attributes
    ----------
    n_train : int
        Rows in the whole /train split.
    n_local : int
        Rows this worker holds.
    rows : ndarray, int64, shape (n_local,)
        Their rows in /train, ascending.
    input_shape : tuple of int
        (C, H, W) or (D,).
    n_classes : int
    steps_per_epoch : int
        ``n_local // batch_size``.
    """

    rows_in_runs = False   # no ``batch_rows``: batches are read one by one

    def __init__(self, path: str | os.PathLike, worker: int, n_workers: int, batch_size: int,
                 seed: int = 0, augment: bool = False, deal: bool = True) -> None:
        if batch_size < 1:
            raise ValueError(f"batch size must be >= 1, got {batch_size}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        slice_bounds(0, worker, n_workers)  # validates worker / n_workers
        self.path = str(path)
        self.worker, self.n_workers = int(worker), int(n_workers)
        self.batch_size, self.seed = int(batch_size), int(seed)
        self.n_train = split_rows(path, "train")
        self.rows = order.worker_rows(self.n_train, self.worker, self.n_workers, self.seed, deal)
        self.x, self.y, attrs = _load_rows(path, "train", self.rows)
        self.n_local = len(self.y)
        self.input_shape = tuple(self.x.shape[1:])
        self.n_classes = attrs["n_classes"]
        self.scale, self.offset = attrs["scale"], attrs["offset"]
        self._attrs = attrs
        if self.n_local < self.batch_size:
            raise ValueError(f"{path}: worker {self.worker} of {self.n_workers} has {self.n_local} "
                             f"training rows, fewer than batch size {self.batch_size}")
        self.steps_per_epoch = self.n_local // self.batch_size
        if augment and len(self.input_shape) != 3:
            raise ValueError(f"{path}: --augment needs images (N, C, H, W), but the samples have "
                             f"shape {self.input_shape}")
        self.augment = max(1, self.input_shape[1] // 8) if augment else 0
        self._order_epoch = -1
        self._order = np.arange(0)

    def order(self, epoch: int) -> np.ndarray:
        """The shuffled local row order of ``epoch`` (int64, shape (n_local,)), fixed by (seed, worker, epoch)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        if epoch != self._order_epoch:
            rng = np.random.default_rng([self.seed, self.worker, int(epoch)])
            self._order = rng.permutation(self.n_local)
            self._order_epoch = int(epoch)
        return self._order

    def _batch_at(self, order: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray]:
        rows = order[i * self.batch_size:(i + 1) * self.batch_size]
        return _to_float(self.x[rows], self._attrs), self.y[rows]

    def epoch(self, e: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Yield the ``steps_per_epoch`` batches of epoch ``e``.

        Yields
        ------
        x : ndarray, float32, shape (batch_size, *input_shape)
        y : ndarray, int64, shape (batch_size,)
        """
        order = self.order(e).copy()
        for i in range(self.steps_per_epoch):
            yield self._batch_at(order, i)

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """The batch for global step ``step`` (epoch ``step // steps_per_epoch``); as :meth:`epoch` yields."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        e, i = divmod(int(step), self.steps_per_epoch)
        x, y = self._batch_at(self.order(e), i)
        if self.augment:
            x = crop_flip(x, np.random.default_rng([self.seed, self.worker, int(step), 1]), self.augment)
        return x, y

    def calibration_rows(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``min(n, n_local)`` of this worker's rows drawn at random by (seed, worker), as :meth:`epoch`
        yields: the samples batch-norm statistics are computed from."""
        pick = order.calibration_sample(self.n_local, n, self.seed, self.worker)
        return _to_float(self.x[pick], self._attrs), self.y[pick]

    def test_set(self, worker: int = 0, n_workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """This evaluator's contiguous slice of /test (near-equal split over ``n_workers``).

        Returns
        -------
        x : ndarray, float32, shape (m, *input_shape)
        y : ndarray, int64, shape (m,)
        """
        lo, hi = slice_bounds(split_rows(self.path, "test"), worker, n_workers)
        x, y, attrs = _load_rows(self.path, "test", np.arange(lo, hi))
        return _to_float(x, attrs), y

    def __repr__(self) -> str:
        return (f"ShardReader({self.path!r}, worker={self.worker}, n_workers={self.n_workers}, "
                f"{self.n_local} of {self.n_train} rows, batch_size={self.batch_size})")
