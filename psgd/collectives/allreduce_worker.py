"""The allreduce protocol (no servers): each worker averages gradients with psgd's ring all-reduce and applies the same optimizer step."""
from __future__ import annotations

import time
import zlib
from collections import Counter

import numpy as np
from mpi4py import MPI

from psgd.collectives import compressed
from psgd.collectives.allreduce import allreduce
from psgd.compress import make as make_compressor
from psgd.compress.momentum import WorkerMomentum
from psgd.config import ProtocolConfig
from psgd.errors import PsgdError
from psgd.halves import WorkerHalf
from psgd.kernels.finite import finite
from psgd.mpi import timeline
from psgd.mpi import wait as _wait
from psgd.mpi.roles import Roles
from psgd.nn.optim import make_optimizer
from psgd.nn.vectors import check_flat


class AllreduceWorker(WorkerHalf):
    """Synchronous data-parallel SGD over the workers' communicator, with replica checks.

    Every worker holds the full flat parameter vector and its own optimizer.
    Each step the flat gradient is averaged across workers with
    :func:`psgd.collectives.allreduce.allreduce` (``op="mean"``) and the optimizer updates
    the local replica; since every worker applies the same averaged gradient to
    the same parameters, the replicas stay bitwise identical, which is checked
    every ``check_every`` steps. With ``config.compression`` the average goes through
    :mod:`psgd.collectives.compressed` instead (its bytes in ``stats["push_bytes"]``).

    Parameters
    ----------
    roles : Roles
        This rank's roles (a worker; the job has no servers).
    shard_map : None
        The contract's shard map; there are no shards.
    config : ProtocolConfig
        The optimizer (made here, for the whole vector), ``n_params`` and
        ``skip_nonfinite``: an averaged gradient holding NaN/Inf is skipped (on
        every worker alike, counted in ``stats["skipped"]``) instead of
        raising :class:`PsgdError`.
    check_every : int
        Compare a checksum of the replicas every this many steps; 0 disables.

    Attributes
    ----------
    optimizer : psgd.nn.optim.Optimizer
        This worker's optimizer (the same state on every worker).
    stats : dict
        Cumulative seconds: ``allreduce_s`` (gradient averaging), ``optimizer_s``,
        ``check_s`` (replica checks) and ``step_s`` (all of :meth:`step`); and the
        counts ``steps``, ``checks`` and ``skipped``.
    """

    def __init__(self, roles: Roles, shard_map, config: ProtocolConfig,
                 check_every: int = 100) -> None:
        if check_every < 0:
            raise ValueError(f"check_every must be >= 0, got {check_every}")
        self.comm = roles.worker_comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.n_params = int(config.n_params)
        self.optimizer = make_optimizer(config.optimizer, self.n_params, **config.opt_hparams)
        self.check_every = int(check_every)
        self.skip_nonfinite = bool(config.skip_nonfinite)
        self.clock = 0
        self._params: np.ndarray | None = None
        self.stats = {"allreduce_s": 0.0, "optimizer_s": 0.0, "check_s": 0.0, "step_s": 0.0,
                      "steps": 0, "checks": 0, "skipped": 0}
        # --compress: qsgd's rounding takes a stream of its own per worker, as a PS worker's
        coding = config.compression
        compressor = make_compressor(coding.compress, coding.compress_bucket,
                                     seed=config.seed * 100_003 + roles.worker_index + 1)
        self.coded = None if compressor is None else compressed.make(
            self.comm.Dup(), compressor, self.n_params, config.compression.feedback)
        if self.coded is not None:
            self.stats["push_bytes"] = 0
        # --momentum-correction: the velocity is averaged, and the optimizer steps without momentum
        self.momentum = (WorkerMomentum(self.n_params, **config.worker_momentum)
                         if config.worker_momentum else None)

    def start(self, params: np.ndarray, clock: int = 0) -> None:
        """Overwrite ``params`` (float32, shape (n_params,)) on every worker with worker 0's (collective)."""
        check_flat(params, self.n_params, "allreduce params")
        _wait.wait(self.comm.Ibcast(params, root=0), "worker 0 (broadcast of initial parameters)")

    def step(self, params: np.ndarray, grad: np.ndarray, clock: int, lr: float) -> None:
        """Average ``grad`` across workers, then update ``params`` in place (collective).

        Parameters
        ----------
        params : ndarray, shape (n_params,), float32
            This worker's replica; updated in place.
        grad : ndarray, shape (n_params,), float32
            This worker's gradient; overwritten with the mean over workers (of
            the velocities, with momentum correction).
        clock : int
            The step number (same on every worker); kept for reporting.
        lr : float
            Learning rate of this step.
        """
        t0 = time.perf_counter()
        check_flat(params, self.n_params, "allreduce params")
        check_flat(grad, self.n_params, "allreduce grad")
        self.clock = int(clock)
        self._params = params
        if self.momentum is not None:
            self.momentum.apply(grad, params, out=grad)
        if self.coded is None:
            allreduce(self.comm, grad, "mean", label=f" of clock {clock}")
        else:
            self.coded.run(grad, True, f" of clock {clock}")
            self.stats["push_bytes"] = self.coded.bytes_sent
        t1 = time.perf_counter()
        # every worker holds the same mean, so all of them skip or fail alike
        if not finite(grad):
            if not self.skip_nonfinite:
                if self.rank != 0:  # one message: worker 0 reports and ends the job
                    _wait.barrier(self.comm, "worker 0 to report the non-finite gradient")
                raise PsgdError(f"the averaged gradient of clock {clock} holds NaN or Inf (a "
                                f"worker's gradient was non-finite); lower the learning rate, "
                                f"or pass --skip-nonfinite")
            self.stats["skipped"] += 1
        else:
            self.optimizer.step(params, grad, lr)
        t2 = time.perf_counter()
        self.stats["allreduce_s"] += t1 - t0
        self.stats["optimizer_s"] += t2 - t1
        if timeline.current is not None:
            timeline.current.span("allreduce", t0, t1, clock)
            timeline.current.span("optimizer", t1, t2, clock)
        self.stats["steps"] += 1
        if self.check_every and self.stats["steps"] % self.check_every == 0:
            self.check_replicas(params)
        self.stats["step_s"] += time.perf_counter() - t0

    def check_replicas(self, params: np.ndarray) -> None:
        """Compare a CRC-32 of ``params`` across workers (collective).

        Raises
        ------
        PsgdError
            Naming the workers whose replica differs from the majority's.
        """
        t0 = time.perf_counter()
        mine = np.array([zlib.crc32(params)], dtype=np.int64)
        every = np.empty(self.size, dtype=np.int64)
        _wait.wait(self.comm.Iallgather(mine, every), "the other workers (replica check)")
        self.stats["checks"] += 1
        self.stats["check_s"] += time.perf_counter() - t0
        if np.all(every == every[0]):
            return
        majority, _ = Counter(every.tolist()).most_common(1)[0]
        diverged = [r for r in range(self.size) if every[r] != majority]
        raise PsgdError(f"allreduce replicas diverged by clock {self.clock}: worker(s) "
                        f"{', '.join(map(str, diverged))} hold parameters that differ from the "
                        f"other {self.size - len(diverged)} worker(s) (CRC-32 of params per "
                        f"worker: {', '.join(f'{c:08x}' for c in every.tolist())})")

    def finish(self, params: np.ndarray | None = None) -> dict:
        """End training (collective): a last replica check, of ``params`` or else of the
        vector last passed to :meth:`step`; returns :attr:`stats`."""
        params = self._params if params is None else params
        if params is not None and self.check_every:
            self.check_replicas(params)
        return self.stats
