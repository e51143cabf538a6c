"""Sparse hogwild updates: a worker Accumulates only the rows its batch touched, one indexed datatype per shard.

Used by :class:`psgd.hogwild.hogwild.HogwildWorker` for a sparse model (``model.sparse``,
``model.touched``, ``model.row_len``) under plain SGD; the step is a
:class:`psgd.nn.lazy_decay.LazyDecaySGD` step, so weight decay stays O(touched rows).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.mpi.shardmap import ShardMap
from psgd.nn.lazy_decay import LazyDecaySGD

INDEX_BYTES = 4  # what a coordinate costs beside its float32 value


class SparseUpdates:
    """The touched-rows step of one worker and its push of index + value.

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
        self._bounds = np.array([shard_map.range(s)[0] for s in range(shard_map.n_shards)]
                                + [shard_map.n], np.int64)

    def delta(self, params: np.ndarray, grad: np.ndarray, lr: float) -> tuple[np.ndarray, np.ndarray]:
        """(coordinates int64 sorted, float32 changes) of one SGD step on the touched rows."""
        rows = self.model.touched
        k = self.row_len
        change = self.sgd.step(params.reshape(self.n_rows, k), grad.reshape(self.n_rows, k), rows, lr)
        coords = (rows[:, None] * k + np.arange(k)).ravel()
        return coords, np.ascontiguousarray(change.ravel(), np.float32)

    def catch_up(self, params: np.ndarray) -> np.ndarray:
        """The dense change that applies every row's pending weight decay (zeros without decay)."""
        return self.sgd.catch_up(params.reshape(self.n_rows, self.row_len)).ravel()

    def accumulate(self, win: MPI.Win, server_rank, coords: np.ndarray, values: np.ndarray) -> int:
        """MPI_Accumulate ``values`` into ``coords`` of the shards (then Flush_all); bytes sent.

        One indexed datatype per shard with a block per touched row (clipped at the shard's
        ends): far cheaper for MPI than a datatype of single elements.
        """
        cuts = np.searchsorted(coords, self._bounds)
        starts = self.model.touched * self.row_len
        types = []
        for shard in range(self.shard_map.n_shards):
            a, b = int(cuts[shard]), int(cuts[shard + 1])
            if a == b:
                continue
            lo, hi = self._bounds[shard], self._bounds[shard + 1]
            inside = (starts < hi) & (starts + self.row_len > lo)
            first = np.maximum(starts[inside], lo)
            lengths = np.minimum(starts[inside] + self.row_len, hi) - first
            dtype = MPI.FLOAT.Create_indexed(lengths.astype(np.int32), (first - lo).astype(np.int32)).Commit()
            types.append(dtype)
            win.Accumulate([values[a:b], MPI.FLOAT], server_rank(shard), (0, 1, dtype), MPI.SUM)
        win.Flush_all()
        for dtype in types:
            dtype.Free()
        return int(coords.size) * (values.itemsize + INDEX_BYTES)
