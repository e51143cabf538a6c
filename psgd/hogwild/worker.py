"""Hogwild's worker half: step locally, MPI_Accumulate the difference into the servers' RMA windows.

The server half is :mod:`psgd.hogwild.server`.  No lock ever excludes a worker; a
read may be torn across elements but no update is lost (per-element atomic
accumulates).  Staleness counts the other workers' updates between a worker's read
and its update (a global counter on server 0).  docs/design/hogwild.md
states what a reader may rely on.
"""
from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI
from numba import njit

from psgd.config import ProtocolConfig
from psgd.errors import PsgdError
from psgd.halves import WorkerHalf
from psgd.hogwild import fused
from psgd.hogwild.server import STATS_TAG
from psgd.hogwild.rows import add_dense, fetch_add, load
from psgd.hogwild.sparse import SparseUpdates
from psgd.hogwild.windows import Windows
from psgd.mpi import timeline, wait
from psgd.mpi.phase import rma_lock
from psgd.mpi.report import StalenessHistogram
from psgd.mpi.roles import Roles
from psgd.mpi.shardmap import ShardMap
from psgd.nn.optim import make_optimizer
from psgd.nn.vectors import check_flat
from psgd.ps import compensation
from psgd.ps.compensation.base import Summary


@njit(cache=True)
def _delta_is_finite(new, old, delta):
    """delta = new - old in one pass; False if any element is NaN or Inf."""
    finite = True
    for i in range(new.size):
        x = new[i] - old[i]
        delta[i] = x
        finite &= np.isfinite(x)
    return finite


class HogwildWorker(WorkerHalf):
    """Worker half: local optimizer step, Accumulate the delta, Get fresh parameters.

    Parameters
    ----------
    roles : Roles
        This rank's roles (must be a worker).
    shard_map : ShardMap
        How the ``config.n_params`` parameters are cut over the servers.
    config : ProtocolConfig
        Run settings (``psgd.protocols.features.make_config("hogwild", ...)`` checks the optimizer).
    window : str, optional
        Parameter window kind (see the module docstring); default from
        ``PSGD_X_HOGWILD_WINDOW``, else ``auto``.

    Attributes
    ----------
    stats : dict
        Cumulative ``push_s``, ``pull_s``, ``wait_s`` (always 0: hogwild never
        waits), ``n_updates``, ``skipped``.
    histogram : StalenessHistogram
        This worker's updates by staleness.

    Notes
    -----
    The constructor, :meth:`start` and :meth:`finish` are collective with
    :func:`psgd.hogwild.server.serve_hogwild` on the servers (window creation, the start and
    end barriers); :meth:`step` involves no other rank.
    """

    def __init__(self, roles: Roles, shard_map: ShardMap, config: ProtocolConfig,
                 window: str | None = None, tallies: bool = False) -> None:
        if shard_map.n != config.n_params:
            raise ValueError(f"shard map covers {shard_map.n} parameters, config says "
                             f"{config.n_params}")
        self.roles, self.shard_map, self.config = roles, shard_map, config
        n = config.n_params
        self.optimizer = make_optimizer(config.optimizer, n, **config.opt_hparams)
        self.windows = Windows(roles, shard_map, window, tallies)
        # elastic hogwild (psgd.elastic.hogwild): the run's last update is number ``limit`` - 1
        # of the global counter (an update whose ticket is past it is not applied, and sets
        # ``over``); ``posted`` is called with the accumulates posted, before they are flushed
        self.limit: int | None = None
        self.over = False
        self.posted = None
        self._new = np.empty(n, dtype=np.float32)
        self._delta = np.empty(n, dtype=np.float32)
        self._one = np.ones(1, dtype=np.int64)
        self._fetched = np.zeros(1, dtype=np.int64)
        self._read_count = 0
        self.histogram = StalenessHistogram()
        # --staleness-comp: amom sets the local momentum, inverse scales each delta
        self._amom = (compensation.make("amom", config, self.optimizer, n, roles.n_workers)
                      if config.compensation.staleness_comp == "amom" else None)
        self._last_delay = 0
        self._inverse = Summary()
        self.grad_buffer = None
        self._started = False
        self.stats = {"push_s": 0.0, "pull_s": 0.0, "wait_s": 0.0, "n_updates": 0, "skipped": 0,
                      "push_bytes": 0, "pull_bytes": 0}
        self._sparse = None

    def use_model(self, model) -> None:
        """Push only the rows a sparse model's batch touched and read only the rows of the next
        batch (see :meth:`before_batch`; SGD, momentum, Nesterov or AdaGrad, weight decay, momentum
        and AdaGrad's accumulators lazily; ``PSGD_X_HOGWILD_SPARSE=off`` moves the whole vector, as
        for a dense model)."""
        if getattr(model, "sparse", False) \
                and self.config.optimizer in ("sgd", "momentum", "nesterov", "adagrad") \
                and os.environ.get("PSGD_X_HOGWILD_SPARSE", "on") != "off":
            self._sparse = SparseUpdates(model, self.shard_map, self.optimizer,
                                         varying_momentum=self._amom is not None,
                                         hot=self.config.hot_rows)
            self._last_params = None

    def start(self, params: np.ndarray, clock: int = 0) -> None:
        """Wait until the servers hold the initial parameters, then read them into ``params``.

        Parameters
        ----------
        params : ndarray, shape (n_params,), float32
            Filled in place.
        clock : int
            The first clock (unused: hogwild counts updates, not clocks).
        """
        check_flat(params, self.config.n_params, "hogwild params")
        wait.barrier(self.roles.comm, "the servers to publish the initial hogwild parameters")
        with rma_lock:   # set-up: the watchdog thread may be in MPI meanwhile
            self.windows.params.Lock_all()
            self.windows.counter.Lock_all()
            self._started = True
            self._pull(params)

    def before_batch(self, params: np.ndarray, x) -> None:
        """Sparse model: read into ``params`` the servers' values of the rows batch ``x`` touches
        (``model.rows_of(x)``), leaving the other rows as they were; dense: nothing (:meth:`step`
        has read the whole vector)."""
        if self._sparse is None:
            return
        t0 = time.perf_counter()
        self._read_clock()
        rows = self._sparse.model.rows_of(x)
        self.stats["pull_bytes"] += self._sparse.read(self.windows, self.roles.server_rank, params, rows)
        self._sparse.before_batch(params, rows)   # momentum: the rows' missed steps
        t1 = time.perf_counter()
        self.stats["pull_s"] += t1 - t0
        if timeline.current is not None:
            timeline.current.span("pull", t0, t1, -1)

    def runs_steps(self) -> bool:
        """Whether :meth:`run_steps` can take this run's steps: a sparse model's updates on a
        ``shared`` window without ``--staleness-comp`` (``PSGD_X_HOGWILD_FUSED=off``: never)."""
        return (os.environ.get("PSGD_X_HOGWILD_FUSED", "on") != "off" and self._sparse is not None
                and self._sparse.fuses and self.windows.shards is not None
                and self.config.compensation.staleness_comp == "none")

    def run_steps(self, params: np.ndarray, x, y: np.ndarray, rows: np.ndarray, clock: int,
                  lrs: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Take ``len(lrs)`` steps from ``clock`` on in one compiled call: :func:`psgd.hogwild.fused.run`
        (batch i: the rows ``rows[i*B:(i+1)*B]`` of the worker's CSR slice ``x``, labels ``y``).
        Returns (losses, corrects, steps done, status); status: see :mod:`psgd.hogwild.fused`."""
        self._last_params = params
        return fused.run(self, params, x, y, rows, clock, lrs)

    def read_all(self, params: np.ndarray) -> None:
        """Read the whole parameter vector into ``params`` (before it is evaluated or saved,
        where :meth:`before_batch` reads only rows), after pushing every row's missed lazy
        steps (weight decay, momentum)."""
        self._pull(params)
        if self._sparse is not None and self._sparse.pending:
            rows, values = self._sparse.catch_up(params)
            self._accumulate(values, rows)
            self._sparse.add_into(params, rows, values)

    def step(self, params: np.ndarray, grad: np.ndarray, clock: int, lr: float) -> None:
        """Apply one update computed from ``grad`` at ``params`` and read fresh parameters
        (a sparse model's: none; :meth:`before_batch` reads the next batch's rows).

        Parameters
        ----------
        params : ndarray, shape (n_params,), float32
            The parameters ``grad`` was computed at (as last read); overwritten
            with freshly read parameters.
        grad : ndarray, shape (n_params,), float32
            The gradient.
        clock : int
            This worker's clock (kept for the common contract; hogwild never waits on it).
        lr : float
            Learning rate of this update.
        """
        if not self._started:
            raise RuntimeError("HogwildWorker.step called before start()")
        check_flat(params, self.config.n_params, "hogwild params")
        check_flat(grad, self.config.n_params, "hogwild grad")
        t0 = time.perf_counter()
        if self._amom is not None:   # the local momentum lowered by the delay measured so far
            _, lr = self._amom.adjust(grad, lr, 0, self._last_delay, None, None)
        if self._sparse is not None:
            rows, delta = self._sparse.delta(params, grad, lr, self.optimizer.momentum
                                             if self._amom is not None else None)
            self._last_params = params
        else:
            rows, delta = None, self._delta
            new = self._new
            np.copyto(new, params)
            self.optimizer.step(new, grad, lr)
        if not (_delta_is_finite(new, params, delta) if rows is None else np.isfinite(delta).all()):
            if not self.config.skip_nonfinite:
                raise PsgdError(f"hogwild worker {self.roles.worker_index}: the update at clock "
                                f"{clock} holds NaN or Inf (use --skip-nonfinite to drop such "
                                f"updates)")
            self.stats["skipped"] += 1
            caught = self._sparse.drop() if self._sparse is not None else None
            if caught is not None:   # the rows' missed steps, taken before the batch, still count
                self._accumulate(caught[1], caught[0])
        else:
            self._push(delta, rows)
        if self._sparse is not None and self._sparse.due:
            self._catch_up(params)
        t1 = time.perf_counter()
        if self._sparse is None:
            self._pull(params)
        t2 = time.perf_counter()
        self.stats["push_s"] += t1 - t0
        self.stats["pull_s"] += t2 - t1
        if timeline.current is not None:
            timeline.current.span("push", t0, t1, clock, self._last_delay)
            if t2 > t1:
                timeline.current.span("pull", t1, t2, clock)

    @property
    def read_count(self) -> int:
        """The global update counter as this worker last read it."""
        return self._read_count

    @property
    def compensation(self) -> dict | None:
        """What ``--staleness-comp`` did on this worker (None: nothing)."""
        if self._amom is not None:
            return self._amom.summary()
        if self.config.compensation.staleness_comp == "inverse":
            return {"method": "inverse", "learning-rate factor": self._inverse.as_dict()}
        return None

    def finish(self) -> None:
        """End the epoch, signal the servers, free the windows, send stats to rank 0."""
        if self._started:
            with rma_lock:   # teardown: the watchdog thread may be in MPI meanwhile
                self._end_epoch()
        else:
            wait.barrier(self.roles.comm, "the servers to publish the initial hogwild parameters")
        windows, roles = self.windows, self.roles
        wait.wait(roles.comm.Ibarrier(), lambda: windows.describe_running(roles),
                  progress=windows.progress)
        self._after_epoch()

    def _end_epoch(self) -> None:
        if self._sparse is not None and self._last_params is not None \
                and self._sparse.pending:   # every row's missed steps, at its present value
            self._catch_up(self._last_params)
        # the finished flag first: with MPICH 5 on one node, Unlock_all of the parameter
        # window can block while another worker (hung) holds its lock_all; the flag lets
        # the stall reports of the ranks still polling name that worker
        self.windows.counter.Accumulate([self._one, MPI.INT64_T], 0,
                                        (1 + self.roles.worker_index, 1, MPI.INT64_T),
                                        MPI.SUM)
        self.windows.counter.Flush(0)
        self.windows.params.Unlock_all()
        self.windows.counter.Unlock_all()
        self._started = False

    def _after_epoch(self) -> None:
        self.windows.free()
        message = np.concatenate([[self.stats["n_updates"], self.stats["skipped"]],
                                  self.histogram.counts]).astype(np.int64)
        wait.wait(self.roles.comm.Isend(message, 0, STATS_TAG),
                  "rank 0 to take the hogwild statistics")

    def _catch_up(self, params: np.ndarray) -> None:
        """Push every row's missed lazy steps (read into ``params`` first where weight decay needs
        the present values)."""
        if self._sparse.catch_up_reads:
            self._pull(params)
        rows, values = self._sparse.catch_up(params)
        self._accumulate(values, rows)

    def _push(self, delta: np.ndarray, rows: np.ndarray | None = None) -> None:
        if self.windows.count is not None:   # shared: a CPU atomic on the counter itself
            fetched = int(fetch_add(self.windows.count, 0, 1))
        else:
            win = self.windows.counter
            win.Fetch_and_op(self._one, self._fetched, 0, 0, MPI.SUM)
            win.Flush(0)
            fetched = int(self._fetched[0])
        if self.limit is not None and fetched >= self.limit:
            self.over = True   # the run's updates are all taken: this one is not applied
            return
        staleness = fetched - self._read_count
        self.histogram.add(staleness)
        self.stats["n_updates"] += 1
        self._last_delay = staleness
        if self.config.compensation.staleness_comp == "inverse":
            factor = 1.0 / (1.0 + staleness)
            self._inverse.add(factor)
            if staleness > 0:
                delta *= np.float32(factor)
        self._accumulate(delta, rows)
        if self.windows.tallies:   # this worker's applied updates, after the update itself
            self.windows.counter.Accumulate([self._one, MPI.INT64_T], 0, (
                self.windows.tally_index(self.roles.worker_index), 1, MPI.INT64_T), MPI.SUM)
            self.windows.counter.Flush(0)

    def _accumulate(self, delta: np.ndarray, rows: np.ndarray | None) -> None:
        """Add ``delta`` (dense, or the values of sorted ``rows``) into the servers' windows."""
        params_win = self.windows.params
        if rows is not None:
            self.stats["push_bytes"] += self._sparse.accumulate(self.windows, self.roles.server_rank,
                                                                rows, delta)
            return
        self.stats["push_bytes"] += delta.nbytes
        if self._sparse is not None and self.windows.shards is not None:
            # the other workers add by CPU atomics, which an MPI_Accumulate may not respect
            add_dense(tuple(self.windows.shards), self._sparse.bounds, delta)
            return
        for shard in range(self.shard_map.n_shards):
            piece = self.shard_map.view(delta, shard)
            if piece.size:
                params_win.Accumulate(piece, self.roles.server_rank(shard),
                                      (0, piece.size, MPI.FLOAT), MPI.SUM)
        if self.posted is not None:
            self.posted()
        params_win.Flush_all()

    def _read_clock(self) -> None:
        if self.windows.count is not None:
            self._read_count = int(load(self.windows.count, 0))
            return
        win = self.windows.counter
        win.Fetch_and_op(self._one, self._fetched, 0, 0, MPI.NO_OP)
        win.Flush(0)
        self._read_count = int(self._fetched[0])

    def _pull(self, params: np.ndarray) -> None:
        self._read_clock()
        self.stats["pull_bytes"] += params.nbytes
        params_win = self.windows.params
        if self.windows.shards is not None:
            params_win.Sync()
            for shard, memory in enumerate(self.windows.shards):
                np.copyto(self.shard_map.view(params, shard), memory)
            return
        for shard in range(self.shard_map.n_shards):
            piece = self.shard_map.view(params, shard)
            if piece.size:
                params_win.Get(piece, self.roles.server_rank(shard), (0, piece.size, MPI.FLOAT))
        params_win.Flush_all()
