"""The worker side of bsp/ssp/asp: push a gradient, pull the next parameters (:class:`PSWorker`)."""
from __future__ import annotations

import math
import time
from typing import Callable, Sequence

import numpy as np

from psgd.compress.feedback import PushEncoder
from psgd.compress.momentum import WorkerMomentum
from psgd.compress import make as make_compressor
from psgd.config import ProtocolConfig
from psgd.halves import WorkerHalf
from psgd.mpi import timeline
from psgd.mpi import wait as _wait
from psgd.mpi.phase import phase
from psgd.mpi.roles import Roles
from psgd.mpi.shardmap import ShardMap
from psgd.nn.vectors import check_flat
from psgd.ps.messages import (DONE, HEADER_BYTES, HEADER_LEN, REPLY_LEN, TAG_CTRL,
                              check_ps_setup, reply_momentum, worker_pull, worker_push)
from psgd.ps.push_window import PushWindow


def _pending(requests: list, owners: Sequence[int]) -> list:
    """Server ranks (``owners[i]`` made ``requests[i]``) whose requests are not all complete."""
    return sorted({owners[i] for i, r in enumerate(requests) if not r.Test()})


def _pairs(n_servers: int) -> list:
    """Owners of requests made two per server, in server order."""
    return [s for s in range(n_servers) for _ in range(2)]


class PSWorker(WorkerHalf):
    """The worker side of bsp/ssp/asp: push a gradient, pull the next parameters.

    The protocol itself lives on the servers (they hold a pull back until the
    protocol allows it), so one class serves all three protocols.

    Overlap (``config.overlap``, which needs a staleness bound >= 1): the
    pull for clock c + 1 is posted as soon as the parameters of clock c are in hand, so it travels (and the
    server may answer it) while the worker computes clock c; :meth:`step`
    then pushes clock c and waits only for what is still missing.  The reply
    lands in a second buffer and is copied into ``params`` at the end of
    :meth:`step`, so the gradient is always computed on parameters the worker
    holds, unchanged during the computation.  The price is staleness: the
    parameters of clock c + 1 were read before this worker's push of clock c
    reached the servers, so every update is at least 1 clock stale under asp
    (and the reply carries the version actually read, so the staleness
    recorded with the next push is exact).  The ssp bound is the servers' and
    holds as before: a pull for clock c + 1 is answered only when the version
    is >= c + 1 - s.  Under bsp and ssp with s = 0 that version needs this
    worker's own push of clock c, so a pull cannot travel during the
    computation: the registry refuses overlap there.  The pull posted ahead at the last
    step (for a clock nobody computes) is completed by :meth:`finish`; s >= 1
    is also what lets the servers answer it.

    Push window (:mod:`psgd.ps.push_window`, on unless ``config.push_window`` is
    off): :meth:`start` makes the window with every rank of the job, and
    :attr:`grad_buffer` is then this worker's segment of it.  A gradient
    computed there goes to the servers of this node without a copy (only the
    header is sent); any other ``grad`` array is sent as messages.  Not with
    overlap (see the module :mod:`psgd.ps.push_window` for why).

    Attributes
    ----------
    stats : dict
        Cumulative ``push_s``, ``pull_s`` (time blocked on pull transfers,
        excluding protocol waits), ``wait_s`` (time blocked while the servers
        held this worker's pull back), ``steps``; ``staleness`` (of the last
        push, max over shards) and ``max_staleness``; ``bound``, the staleness
        bound in force at the last reply (min over shards; inf: none).
    read_versions : ndarray, int64 (S,)
        Version of each shard in the parameters the worker holds.
    read_bounds : ndarray, float64 (S,)
        The staleness bound each shard's server had in force when it sent them
        (inf: none); ``read_versions >= clock - read_bounds`` for their clock.
    read_momenta : ndarray, float64 (S,)
        The momentum each shard's server had in force for the workers' velocities
        when it sent them (``--momentum-correction``; 0 without it).
    """

    #: called between the polls of a push's or a pull's wait (None: nothing; an elastic
    #: worker checks that its servers are still there)
    between_polls: Callable[[], None] | None = None

    def __init__(self, roles: Roles, shard_map: ShardMap, config: ProtocolConfig) -> None:
        check_ps_setup(roles, shard_map, config)
        if not roles.is_worker:
            raise ValueError(f"rank {roles.rank} is a server; PSWorker runs on workers")
        self.comm = roles.comm
        self.shard_map = shard_map
        self.config = config
        self.overlap = overlap = config.overlap
        self.optimizer = None   # the servers own it
        S = shard_map.n_shards
        self.read_versions = np.zeros(S, np.int64)
        self.read_bounds = np.full(S, math.inf)
        self._push_hdr = np.zeros((S, HEADER_LEN), np.int64)
        self._pull_hdr = np.zeros((S, HEADER_LEN), np.int64)
        self._reply_hdr = np.zeros((S, REPLY_LEN), np.int64)
        self._done_hdr = np.zeros((S, HEADER_LEN), np.int64)
        # overlap: the pull in flight (requests, its clock, when it was posted) and its buffer
        self._ahead = np.empty(shard_map.n if overlap else 0, np.float32)
        self.window: PushWindow | None = None
        self._in_window: list[bool] = [False] * S   # servers that read grad_buffer in place
        # the server of each push request: by messages (header, payload), through the window
        self._owners = {False: _pairs(S), True: _pairs(S)}
        self._pull_reqs: list = []
        self._pull_clock = -1
        self._pull_posted = 0.0
        self._finished = False
        self.stats = {"push_s": 0.0, "pull_s": 0.0, "wait_s": 0.0, "steps": 0,
                      "staleness": 0, "max_staleness": 0, "push_bytes": 0,
                      "bound": math.inf}
        # qsgd's rounding: a stream of its own per worker, repeatable from the run's seed
        coding = config.compression
        compressor = make_compressor(coding.compress, coding.compress_bucket,
                                     seed=config.seed * 100_003 + roles.worker_index + 1)
        self.encoder = (PushEncoder(compressor, shard_map, config.compression.feedback)
                        if compressor is not None else None)
        # --momentum-correction: the worker pushes its velocity, not the gradient, each shard's
        # part with the momentum its server's last reply named (ssp/asp: the compensation's)
        self.momentum = (WorkerMomentum(shard_map.n, **config.worker_momentum)
                         if config.worker_momentum else None)
        self.read_momenta = np.zeros(S)
        self._parts = [slice(*shard_map.range(s)) for s in range(S)]
        # a gradient pushed from the push window is sent as it is: not when overlapping or coded
        self._window_push = not overlap and self.encoder is None and self.momentum is None

    @property
    def grad_buffer(self) -> np.ndarray | None:
        """After :meth:`start`: the float32 (n,) gradient buffer the servers of this node read
        in place (this worker's segment of the push window), or None without one."""
        if self.window is None or not self._window_push:
            return None
        return self.window.own

    @property
    def read_version(self) -> int:
        """Oldest shard version in the parameters the worker holds."""
        return int(self.read_versions.min())

    def _post_pull(self, into: np.ndarray, clock: int) -> None:
        self._pull_reqs = worker_pull(self.comm, self.shard_map, into, clock, self._pull_hdr,
                                      self._reply_hdr)
        self._pull_clock = clock
        self._pull_posted = time.perf_counter()

    def _wait_push(self, push: list, owners: list, clock: int) -> None:
        t0 = time.perf_counter()
        _wait.waitall(push, lambda: f"server rank(s) {_pending(push, owners)} to take the push "
                      f"of clock {clock} (shards = ranks)", serve=self.between_polls)
        t1 = time.perf_counter()
        self.stats["push_s"] += t1 - t0
        if timeline.current is not None:
            timeline.current.span("push", t0, t1, clock, self.stats["staleness"])

    def _wait_pull(self) -> None:
        """Complete the pull in flight; split the time blocked into protocol wait and transfer."""
        reqs, clock, S = self._pull_reqs, self._pull_clock, self.shard_map.n_shards
        t0 = time.perf_counter()
        _wait.waitall(reqs, lambda: f"server rank(s) {_pending(reqs[:2 * S], _pairs(S))} to "
                      f"answer the pull for clock {clock} (shards = ranks; a server holds a pull "
                      f"until the protocol allows it: its own report names the worker it waits "
                      f"for)", serve=self.between_polls)
        t1 = time.perf_counter()
        self._pull_reqs = []
        # the servers answered about held seconds after the pull was posted
        answered = self._pull_posted + float(self._reply_hdr[:, 1].max()) * 1e-6
        held = min(max(answered - t0, 0.0), t1 - t0)
        self.stats["wait_s"] += held
        self.stats["pull_s"] += t1 - t0 - held
        if timeline.current is not None:   # the protocol's hold first, then the transfer
            timeline.current.span("wait", t0, t0 + held, clock)
            timeline.current.span("pull", t0 + held, t1, clock)
        self.read_versions[:] = self._reply_hdr[:, 2]
        self.read_bounds[:] = np.where(self._reply_hdr[:, 0] < 0, math.inf, self._reply_hdr[:, 0])
        self.stats["bound"] = float(self.read_bounds.min())
        self.read_momenta[:] = reply_momentum(self._reply_hdr)

    def start(self, params: np.ndarray, clock: int = 0) -> None:
        """Pull the parameters for the first clock into ``params`` (float32 (n,)).

        ``clock`` is the first clock this worker computes (0, or the resumed step).
        With overlap, the pull for the next clock is posted before this returns.
        Collective over the job communicator when ``config.push_window`` is on
        (the servers' :func:`psgd.ps.server.serve` makes the window with it).
        """
        check_flat(params, self.shard_map.n, "params")
        if self.config.push_window and self.window is None:
            self.window = PushWindow(self.comm, self.shard_map.n if self._window_push else 0)
            if self._window_push:
                self._in_window = [self.window.node_rank(s) >= 0
                                   for s in range(self.shard_map.n_shards)]
                self._owners[True] = [s for s, shared in enumerate(self._in_window)
                                      for _ in range(1 if shared else 2)]
        with phase("first pull"):
            self._post_pull(params, int(clock))
            self._wait_pull()
        if self.overlap:
            self._post_pull(self._ahead, int(clock) + 1)

    def step(self, params: np.ndarray, grad: np.ndarray, clock: int, lr: float | None = None) -> None:
        """Push ``grad`` (computed on the params held for ``clock``); ``params`` then hold clock + 1.

        Parameters
        ----------
        params : ndarray, float32 (n,)
            Overwritten with the parameters for ``clock + 1`` once the protocol
            allows.  With overlap they come from the pull posted at the end of
            the previous step (or by :meth:`start`), and the pull for
            ``clock + 2`` is posted before this returns.
        grad : ndarray, float32 (n,)
            The gradient; unchanged, and free to reuse when this returns.
            :attr:`grad_buffer` goes to this node's servers without a copy.
        clock : int
            0-based clock the gradient was computed at.
        lr : float, optional
            Ignored: the servers use ``config.lr_schedule(clock)``.
        """
        check_flat(params, self.shard_map.n, "params")
        check_flat(grad, self.shard_map.n, "grad")
        clock = int(clock)
        if self.overlap and self._pull_clock != clock + 1:
            raise ValueError(f"step for clock {clock}, but the pull in flight is for clock "
                             f"{self._pull_clock}: with overlap, steps go one clock at a time "
                             f"from the clock given to start()")
        stale = clock - self.read_versions
        self.stats["staleness"] = int(stale.max())
        self.stats["max_staleness"] = max(self.stats["max_staleness"], self.stats["staleness"])
        shared = (self.grad_buffer is not None
                  and grad.ctypes.data == self.window.own.ctypes.data)
        if shared:
            self.window.sync()   # the gradient's writes before the headers that announce them
        if self.momentum is not None:
            grad = self.momentum.apply(grad, params,
                                       parts=list(zip(self._parts, self.read_momenta)))
        frames = self.encoder.encode(grad) if self.encoder is not None else None
        push = worker_push(self.comm, self.shard_map, grad, clock, self.read_versions,
                           self._push_hdr, self._in_window if shared else None, frames)
        self.stats["push_bytes"] += HEADER_BYTES * self.shard_map.n_shards + (
            sum(f.shape[0] for f in frames) if frames is not None else
            4 * sum(self.shard_map.size(s) for s in range(self.shard_map.n_shards)))
        if not self.overlap:
            self._post_pull(params, clock + 1)
        self._wait_push(push, self._owners[shared], clock)
        self._wait_pull()
        if self.overlap:
            np.copyto(params, self._ahead)
            self._post_pull(self._ahead, clock + 2)
        self.stats["steps"] += 1

    def finish(self) -> None:
        """Tell every server this worker is done (idempotent).

        With overlap, the pull posted ahead is completed first (the servers
        answer it as the protocol allows) and its parameters are dropped.
        """
        if self._finished:
            return
        self._finished = True
        if self._pull_reqs:
            self._wait_pull()
        reqs = []
        for s in range(self.shard_map.n_shards):
            self._done_hdr[s] = (DONE, 0, 0, s)
            reqs.append(self.comm.Isend(self._done_hdr[s], s, TAG_CTRL))
        _wait.waitall(reqs, "servers to take this worker's done message")
        if self.window is not None:   # grad_buffer is gone with it
            self.window.free()
            self.window = None

