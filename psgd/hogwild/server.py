"""Hogwild's server half: host this rank's shard in an RMA window while the workers train.

The workers add and read there with no part for this rank (:mod:`psgd.hogwild.worker`,
the other half); it imports no numba, which only the workers' kernels need.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from psgd.config import ProtocolConfig
from psgd.hogwild.windows import Windows
from psgd.mpi import faults, wait
from psgd.mpi.phase import phase, rma_lock
from psgd.mpi.report import ServerResult, StalenessHistogram
from psgd.mpi.roles import Roles
from psgd.mpi.shardmap import ShardMap

SERVER_MAX_SLEEP = 0.01  # s: an idle server's longest backoff sleep (sees the end <= 10 ms late)
PROGRESS_MAX_SLEEP = 5e-5  # s: the longest, where each worker's one-sided op waits for this rank
STATS_TAG = 0x4807       # a worker's update count, skips and staleness histogram, to rank 0
PARAMS_TAG = 0x4808


@dataclass
class HogwildResult(ServerResult):
    """What one hogwild server rank reports after :func:`serve_hogwild`.

    The fields of :class:`psgd.mpi.report.ServerResult` (a hogwild server takes no
    pushes and keeps no optimizer state: ``n_pushes``, ``opt_state``,
    ``n_snapshots`` and ``buffer_bytes`` stay empty), plus ``window``, the
    parameter window kind used.  ``params``, ``staleness_hist`` and
    ``n_skipped`` are filled on rank 0 only.
    """

    window: str = ""


def serve_hogwild(roles: Roles, shard_map: ShardMap, config: ProtocolConfig,
                  init_shard: np.ndarray, init_opt_state: dict | None = None,
                  on_snapshot=None, start_clock: int = 0,
                  window: str | None = None) -> HogwildResult:
    """Server half: host this shard in an RMA window until every worker has finished.

    Parameters
    ----------
    roles : Roles
        This rank's roles (must be a server).
    shard_map : ShardMap
        How the parameters are cut; this server holds shard ``roles.server_index``.
    config : ProtocolConfig
        Run settings.
    init_shard : ndarray, shape (shard_map.size(roles.server_index),), float32
        Initial parameters of this shard.
    init_opt_state, on_snapshot, start_clock
        The server contract's other arguments, unused: the optimizer state
        lives on the workers, and there is no consistent snapshot point.
    window : str, optional
        Parameter window kind; must agree on every rank.

    Returns
    -------
    HogwildResult
        ``cpu_s`` and ``wall_s`` of this server, ``n_updates`` (all workers'
        updates, read from the global counter), ``window`` (the kind used); on
        rank 0 also ``params`` (the final full vector gathered from all
        servers), ``staleness_hist`` (over all workers) and ``n_skipped``.
    """
    cpu0, wall0 = time.process_time(), time.perf_counter()
    comm, shard, rank = roles.comm, roles.server_index, roles.comm.Get_rank()
    init_shard = np.asarray(init_shard)
    if init_shard.dtype != np.float32 or init_shard.shape != (shard_map.size(shard),):
        raise ValueError(f"server {shard}: init shard must be float32 of shape "
                         f"({shard_map.size(shard)},), got {init_shard.dtype} {init_shard.shape}")
    windows = Windows(roles, shard_map, window)
    with phase("publishing the initial parameters"):
        with rma_lock:
            _publish(windows, init_shard, rank)
        wait.barrier(comm, "the hogwild workers to attach their windows")
    _idle_until_done(roles, windows, faults.for_rank(rank))
    with rma_lock:
        final, n_updates = _read_final(windows, rank)
    result = HogwildResult(staleness_hist=np.zeros(0, np.int64), n_updates=n_updates,
                           window=windows.kind)
    windows.free()
    with phase("gathering the final shards"):
        if rank == 0:
            result.params, result.staleness_hist, result.n_skipped = _gather_on_root(
                roles, shard_map, final)
        else:
            wait.wait(comm.Isend(final, 0, PARAMS_TAG), "rank 0 to take the final hogwild shard")
    result.cpu_s = time.process_time() - cpu0
    result.wall_s = time.perf_counter() - wall0
    return result


def _publish(windows: Windows, init_shard: np.ndarray, rank: int) -> None:
    """Put the initial shard into this server's window; rank 0 zeroes the counters."""
    windows.params.Lock(rank, MPI.LOCK_EXCLUSIVE)
    windows.local[:] = init_shard
    windows.params.Sync()
    windows.params.Unlock(rank)
    if rank == 0:
        windows.counter.Lock(0, MPI.LOCK_EXCLUSIVE)
        np.frombuffer(windows.counter.tomemory(), dtype=np.int64,
                      count=windows.n_counters)[:] = 0
        windows.counter.Unlock(0)


def _read_final(windows: Windows, rank: int) -> tuple[np.ndarray, int]:
    """A copy of this server's final shard, and the global update count."""
    windows.params.Lock(rank, MPI.LOCK_SHARED)
    windows.params.Sync()
    final = windows.local.copy()
    windows.params.Unlock(rank)
    count = np.zeros(1, dtype=np.int64)
    windows.counter.Lock(0, MPI.LOCK_SHARED)
    windows.counter.Fetch_and_op(count, count, 0, 0, MPI.NO_OP)
    windows.counter.Unlock(0)
    return final, int(count[0])


def _idle_until_done(roles: Roles, windows: Windows, fault) -> None:
    # Training happens now, with no part for this rank. Where the workers'
    # RMA needs no target progress the barrier is polled with a long backoff
    # cap, keeping the server's CPU near zero; otherwise (across nodes, or a
    # created window) every worker's Get and Accumulate moves only as this rank
    # polls, so it polls densely, each poll driving MPI progress.  The wait
    # lasts the whole training, so only a stop of the updates counts as a stall.
    # Once a worker has set its finished flag, its Unlock_all and the end barrier
    # wait on this rank's progress: from then on it polls at least as often as
    # the usual cap (PSGD_X_POLL_MAX_SLEEP).
    old = wait.settings.max_sleep
    idle = (max(old, SERVER_MAX_SLEEP) if windows.target_progress_free
            else min(old, PROGRESS_MAX_SLEEP))
    wait.configure(max_sleep=idle)
    try:
        request = roles.comm.Ibarrier()
        poller = wait.Poller(lambda: windows.describe_running(roles), windows.progress)
        ending = False
        while not request.Test():
            if fault is not None:  # tests only (PSGD_X_FAULT): step = updates so far
                fault.at(int(windows.read_counters()[0]))
            if not ending and windows.any_finished():
                ending = True
                wait.configure(max_sleep=min(idle, old))
                poller.restart()
            poller.idle()
    finally:
        wait.configure(max_sleep=old)


def _gather_on_root(roles: Roles, shard_map: ShardMap,
                    final: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Rank 0: the full final vector, the workers' summed staleness histogram and skip count."""
    comm = roles.comm
    params = np.empty(shard_map.n, dtype=np.float32)
    shard_map.view(params, 0)[:] = final
    requests = [comm.Irecv(shard_map.view(params, s), roles.server_rank(s), PARAMS_TAG)
                for s in range(1, shard_map.n_shards)]
    wait.waitall(requests, "the other servers' final hogwild shards")
    hist = StalenessHistogram()
    skipped = 0
    status = MPI.Status()
    for k in range(roles.n_workers):
        source = roles.worker_rank(k)
        wait.probe(comm, source, STATS_TAG, status, f"worker {k}'s hogwild statistics")
        message = np.empty(status.Get_count(MPI.INT64_T), dtype=np.int64)
        comm.Recv(message, source, STATS_TAG)
        skipped += int(message[1])
        hist.merge(message[2:])
    return params, hist.counts, skipped
