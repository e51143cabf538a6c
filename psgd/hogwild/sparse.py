"""Sparse hogwild: a worker adds and reads only the rows its batches touch.

On a ``shared`` window by CPU atomics and plain loads; otherwise by MPI_Accumulate and
MPI_Get with one indexed datatype per shard.

Used by :class:`psgd.hogwild.worker.HogwildWorker` for a sparse model (``model.sparse``,
``model.touched``, ``model.rows_of``, ``model.row_len``) under plain SGD; the step is a
:class:`psgd.nn.lazy_decay.LazyDecaySGD` step, so weight decay stays O(touched rows).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI
from numba import njit

from psgd.kernels.atomic import atomic_add, atomic_add_pair, atomic_load
from psgd.mpi.shardmap import ShardMap
from psgd.nn.lazy_decay import LazyDecaySGD

INDEX_BYTES = 4  # what a coordinate costs beside its float32 value


@njit(cache=True)
def copy_rows(dst, shards, bounds, rows, k):
    """``dst`` at the coordinates of the k-long ``rows`` = the shared ``shards``' values there
    (shard s holds the coordinates ``[bounds[s], bounds[s + 1])``)."""
    for s in range(len(shards)):
        src, lo, hi = shards[s], bounds[s], bounds[s + 1]
        for r in rows:
            for c in range(max(r * k, lo), min(r * k + k, hi)):
                dst[c] = src[c - lo]


@njit(cache=True)
def add_rows(shards, bounds, rows, k, values):
    """Atomically add ``values`` (the k-long ``rows`` in order, flat) into the shared ``shards``
    (a tuple of float32 arrays; shard s holds the coordinates ``[bounds[s], bounds[s + 1])``)."""
    for m in range(rows.size):
        c = rows[m] * k
        s = 0
        while bounds[s + 1] <= c:
            s += 1
        if c + k <= bounds[s + 1]:   # the row lies in one shard: two elements per atomic
            shard, at, v = shards[s], c - bounds[s], m * k
            j = 0
            if (shard.ctypes.data + 4 * at) % 8:
                atomic_add(shard, at, values[v])
                j = 1
            while j + 1 < k:
                atomic_add_pair(shard, at + j, values[v + j], values[v + j + 1])
                j += 2
            if j < k:
                atomic_add(shard, at + j, values[v + j])
            continue
        for j in range(k):
            t = s
            while bounds[t + 1] <= c + j:
                t += 1
            atomic_add(shards[t], c + j - bounds[t], values[m * k + j])


@njit(cache=True)
def add_dense(shards, bounds, values):
    """Atomically add the whole vector ``values`` into the shared ``shards``."""
    for s in range(len(shards)):
        lo = bounds[s]
        for c in range(bounds[s + 1] - lo):
            atomic_add(shards[s], c, values[lo + c])


@njit(cache=True)
def fetch_add(count, i, v):
    """``count[i] += v`` atomically; the value before."""
    return atomic_add(count, i, v)


@njit(cache=True)
def load(count, i):
    """``count[i]``, read whole."""
    return atomic_load(count, i)


@njit(cache=True)
def _scatter_rows(dst, values, rows, k):
    """``dst`` at the coordinates of the k-long ``rows``, in order, = ``values``."""
    for m in range(rows.size):
        for c in range(k):
            dst[rows[m] * k + c] = values[m * k + c]


class SparseUpdates:
    """The touched-rows step of one worker, its push and its read of index + value.

    Parameters
    ----------
    model : a sparse model (``touched``: int64 row ids of the last batch; ``row_len``)
    shard_map : ShardMap
    weight_decay : float
    """

    def __init__(self, model, shard_map: ShardMap, weight_decay: float) -> None:
        self.model, self.shard_map = model, shard_map
        self.row_len = int(model.row_len)
        self.n_rows = shard_map.n // self.row_len
        self.sgd = LazyDecaySGD(self.n_rows, self.row_len, weight_decay)
        self.bounds = np.array([shard_map.range(s)[0] for s in range(shard_map.n_shards)]
                                + [shard_map.n], np.int64)

    def coords(self, rows: np.ndarray) -> np.ndarray:
        """The sorted int64 coordinates of sorted distinct ``rows``."""
        return (rows[:, None] * self.row_len + np.arange(self.row_len)).ravel()

    def delta(self, params: np.ndarray, grad: np.ndarray, lr: float) -> tuple[np.ndarray, np.ndarray]:
        """(coordinates int64 sorted, float32 changes) of one SGD step on the touched rows."""
        rows = self.model.touched
        k = self.row_len
        change = self.sgd.step(params.reshape(self.n_rows, k), grad.reshape(self.n_rows, k), rows, lr)
        return self.coords(rows), np.ascontiguousarray(change.ravel(), np.float32)

    def catch_up(self, params: np.ndarray) -> np.ndarray:
        """The dense change that applies every row's pending weight decay (zeros without decay)."""
        return self.sgd.catch_up(params.reshape(self.n_rows, self.row_len)).ravel()

    def _shard_types(self, rows: np.ndarray, coords: np.ndarray):
        """Per shard that ``rows`` touch: (shard, a, b, datatype) with ``coords[a:b]`` in it.

        One indexed datatype with a block per row (clipped at the shard's ends; of equal
        blocks where none is clipped): far cheaper for MPI than a datatype of single
        elements. The caller frees the datatypes.
        """
        cuts = np.searchsorted(coords, self.bounds)
        starts = rows * self.row_len
        for shard in range(self.shard_map.n_shards):
            a, b = int(cuts[shard]), int(cuts[shard + 1])
            if a == b:
                continue
            lo, hi = self.bounds[shard], self.bounds[shard + 1]
            inside = (starts < hi) & (starts + self.row_len > lo)
            first = np.maximum(starts[inside], lo)
            lengths = np.minimum(starts[inside] + self.row_len, hi) - first
            displacements = (first - lo).tolist()   # lists: mpi4py reads arrays element by element
            if (lengths == self.row_len).all():
                dtype = MPI.FLOAT.Create_indexed_block(self.row_len, displacements)
            else:
                dtype = MPI.FLOAT.Create_indexed(lengths.tolist(), displacements)
            yield shard, a, b, dtype.Commit()

    def accumulate(self, windows, server_rank, coords: np.ndarray, values: np.ndarray) -> int:
        """Add ``values`` into ``coords`` (of the last batch's rows); bytes sent.

        A ``shared`` window takes CPU atomic adds (:func:`add_rows`); otherwise one
        MPI_Accumulate per shard with an indexed datatype, then Flush_all.
        """
        if windows.shards is not None:
            add_rows(tuple(windows.shards), self.bounds, self.model.touched, self.row_len, values)
            return int(coords.size) * (values.itemsize + INDEX_BYTES)
        win = windows.params
        types = []
        for shard, a, b, dtype in self._shard_types(self.model.touched, coords):
            types.append(dtype)
            win.Accumulate([values[a:b], MPI.FLOAT], server_rank(shard), (0, 1, dtype), MPI.SUM)
        win.Flush_all()
        for dtype in types:
            dtype.Free()
        return int(coords.size) * (values.itemsize + INDEX_BYTES)

    def read(self, windows, server_rank, params: np.ndarray, rows: np.ndarray) -> int:
        """Read the servers' values of sorted distinct ``rows`` into ``params``; bytes read.

        A ``shared`` window is read by plain loads of those coordinates; otherwise one
        MPI_Get per shard with the indexed datatype of :meth:`accumulate`, then Flush_all.
        Other coordinates of ``params`` are left as they are.
        """
        k = self.row_len
        if windows.shards is not None:
            windows.params.Sync()
            copy_rows(params, tuple(windows.shards), self.bounds, rows, k)
            return int(rows.size) * k * (4 + INDEX_BYTES)
        coords = self.coords(rows)
        values = np.empty(coords.size, np.float32)
        types = []
        for shard, a, b, dtype in self._shard_types(rows, coords):
            types.append(dtype)
            windows.params.Get([values[a:b], MPI.FLOAT], server_rank(shard), (0, 1, dtype))
        windows.params.Flush_all()
        for dtype in types:
            dtype.Free()
        _scatter_rows(params, values, rows, k)
        return int(coords.size) * (4 + INDEX_BYTES)
