"""Sparse hogwild: a worker adds and reads only the rows its batches touch.

On a ``shared`` window by CPU atomics and plain loads; otherwise by MPI_Accumulate and
MPI_Get with one indexed datatype per shard.

Used by :class:`psgd.hogwild.worker.HogwildWorker` for a sparse model (``model.sparse``,
``model.touched``, ``model.rows_of``, ``model.row_len``) under SGD, momentum, Nesterov or AdaGrad;
the step is a :class:`psgd.nn.lazy_decay.LazyDecaySGD`, :class:`psgd.nn.lazy_momentum.LazyMomentum`
or :class:`psgd.nn.lazy_adagrad.LazyAdagrad` step, so weight decay, momentum and AdaGrad's
accumulators stay O(touched rows).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI
from numba import njit

from psgd.hogwild.hot import HOT_TOUCH, hot_rows
from psgd.hogwild.rows import add_rows, copy_rows
from psgd.mpi.shardmap import ShardMap
from psgd.nn.lazy_adagrad import LazyAdagrad
from psgd.nn.lazy_decay import LazyDecaySGD
from psgd.nn.lazy_momentum import LazyMomentum
from psgd.nn.optim import Adagrad, Momentum, Optimizer

INDEX_BYTES = 4  # what a coordinate costs beside its float32 value


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
    optimizer : Optimizer
        SGD or momentum (Nesterov); its hyper-parameters, and for momentum its velocity, which
        the lazy steps keep.
    varying_momentum : bool
        The momentum may change at each step (``--staleness-comp amom``): momentum 0 is then
        still taken as momentum.
    hot : psgd.protocols.features.HotRowOptions or None
        The run's hot rows (``--hold-hot``: steps the fused run, :mod:`psgd.hogwild.fused`,
        holds their changes, None or 1: none held; ``--hot-touch``: which rows are hot).
    """

    def __init__(self, model, shard_map: ShardMap, optimizer: Optimizer,
                 varying_momentum: bool = False, hot=None) -> None:
        self.model, self.shard_map = model, shard_map
        self.hold = int(hot.hold_hot or 1) if hot else 1
        self.touch = HOT_TOUCH if hot is None or hot.hot_touch is None else hot.hot_touch
        self.row_len = int(model.row_len)
        self.n_rows = shard_map.n // self.row_len
        wd = optimizer.weight_decay
        if isinstance(optimizer, Adagrad):
            if wd:
                raise ValueError("--optimizer adagrad with --weight-decay moves every row at every "
                                 "step, which sparse steps cannot do lazily; drop --weight-decay")
            self.lazy = LazyAdagrad(self.n_rows, self.row_len, optimizer.eps, optimizer.acc)
        elif isinstance(optimizer, Momentum) and (optimizer.momentum or varying_momentum):
            self.lazy = LazyMomentum(self.n_rows, self.row_len, optimizer.momentum,
                                     optimizer.nesterov, wd, optimizer.velocity)
        else:   # momentum 0 is SGD
            self.lazy = LazyDecaySGD(self.n_rows, self.row_len, wd)
        self.bounds = np.array([shard_map.range(s)[0] for s in range(shard_map.n_shards)]
                                + [shard_map.n], np.int64)
        self._caught_up = None   # (rows, their changes) of before_batch's catch-up, not yet pushed
        self._held = None

    def held(self, x, batch: int) -> tuple[np.ndarray, np.ndarray, int]:
        """(slot, hot, hold) of :func:`psgd.hogwild.hot.hot_rows` for the worker's CSR slice ``x``
        at ``batch`` rows a step and this run's hold, kept for the next run."""
        key = (id(x), batch)
        if self._held is None or self._held[0] != key:
            self._held = key, (*hot_rows(x.indices, max(len(x.indptr) - 1, 1), self.n_rows, batch,
                                         self.hold, self.touch), self.hold)
        return self._held[1]

    @property
    def fuses(self) -> bool:
        """Whether :mod:`psgd.hogwild.fused` can take these steps (plain SGD, AdaGrad)."""
        return isinstance(self.lazy, (LazyDecaySGD, LazyAdagrad))

    @property
    def pending(self) -> bool:
        """Whether rows may hold missed steps that :meth:`catch_up` would apply."""
        return not self.fuses or self.lazy.weight_decay != 0

    @property
    def adagrad(self) -> bool:
        """Whether the steps are AdaGrad's (nothing to catch up on)."""
        return isinstance(self.lazy, LazyAdagrad)

    @property
    def due(self) -> bool:
        """Whether :meth:`catch_up` must run before the next step (momentum's products restart)."""
        return isinstance(self.lazy, LazyMomentum) and self.lazy.needs_sweep

    @property
    def catch_up_reads(self) -> bool:
        """Whether :meth:`catch_up` needs the present values (weight decay moves with them)."""
        return self.lazy.weight_decay != 0

    def coords(self, rows: np.ndarray) -> np.ndarray:
        """The sorted int64 coordinates of sorted distinct ``rows``."""
        return (rows[:, None] * self.row_len + np.arange(self.row_len)).ravel()

    def before_batch(self, params: np.ndarray, rows: np.ndarray) -> None:
        """Bring the just read sorted ``rows`` of ``params`` to the present (their missed steps:
        momentum, weight decay), so the batch's gradient is taken where the eager optimizer would
        take it; the change is pushed with the step's (:meth:`delta`), or alone (:meth:`drop`)."""
        if self.pending:
            self._caught_up = rows, self.lazy.catch_up_rows(params.reshape(self.n_rows, self.row_len),
                                                           rows)

    def delta(self, params: np.ndarray, grad: np.ndarray, lr: float,
              momentum: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(rows int64 sorted, float32 changes of their coordinates, flat) of one step on the
        touched rows, with :meth:`before_batch`'s catch-up; ``momentum``: this step's, for
        momentum (default the optimizer's)."""
        rows = self.model.touched
        k = self.row_len
        w, g = params.reshape(self.n_rows, k), grad.reshape(self.n_rows, k)
        if isinstance(self.lazy, LazyDecaySGD):
            change = self.lazy.step(w, g, rows, lr)
        elif self.adagrad:
            change, _ = self.lazy.step(w, g, rows, lr)
        else:
            change, _ = self.lazy.step(w, g, rows, lr, momentum)
        caught = self.drop()
        if caught is not None:
            if np.array_equal(caught[0], rows):
                change += caught[1].reshape(-1, k)
            else:   # the batch's rows are not its gradient's: push their union
                union = np.union1d(rows, caught[0])
                merged = np.zeros((len(union), k), np.float32)
                merged[np.searchsorted(union, rows)] += change
                merged[np.searchsorted(union, caught[0])] += caught[1].reshape(-1, k)
                rows, change = union, merged
        return rows, np.ascontiguousarray(change.ravel(), np.float32)

    def drop(self) -> tuple[np.ndarray, np.ndarray] | None:
        """:meth:`before_batch`'s catch-up not yet pushed, as (rows, changes flat), forgotten here
        (None: none); a dropped step's caller pushes it alone."""
        caught, self._caught_up = self._caught_up, None
        return None if caught is None else (caught[0], caught[1].ravel())

    def catch_up(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted rows, their float32 changes, flat) that apply every row's missed steps."""
        w = params.reshape(self.n_rows, self.row_len)
        if self.adagrad:
            return np.zeros(0, np.int64), np.zeros(0, np.float32)
        if self.fuses:
            change = self.lazy.catch_up(w)
            rows = np.flatnonzero(change.any(axis=1))
        else:
            change, rows = self.lazy.catch_up(w)
        return rows, np.ascontiguousarray(change[rows].ravel(), np.float32)

    def add_into(self, params: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        """``params`` at ``rows`` += ``values`` (as :meth:`accumulate` adds them on the servers)."""
        params.reshape(self.n_rows, self.row_len)[rows] += values.reshape(len(rows), self.row_len)

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

    def accumulate(self, windows, server_rank, rows: np.ndarray, values: np.ndarray) -> int:
        """Add ``values`` into the coordinates of sorted distinct ``rows``; bytes sent.

        A ``shared`` window takes CPU atomic adds (:func:`add_rows`); otherwise one
        MPI_Accumulate per shard with an indexed datatype, then Flush_all.
        """
        if windows.shards is not None:
            add_rows(tuple(windows.shards), self.bounds, rows, self.row_len, values)
            return int(values.size) * (values.itemsize + INDEX_BYTES)
        coords = self.coords(rows)
        win = windows.params
        types = []
        for shard, a, b, dtype in self._shard_types(rows, coords):
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
