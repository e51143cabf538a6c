"""The RMA windows of a hogwild run: the parameter window over the server shards, and the update counter.

The parameter window is one of (``window=``, then ``PSGD_X_HOGWILD_WINDOW``, then ``auto``):
``shared`` (``MPI_Win_allocate_shared``, one node only: workers read the shards by
plain loads), ``allocate`` (``MPI_Win_allocate``, read with ``MPI_Get``; also across
nodes), ``create`` (``MPI_Win_create`` over a numpy array: correct but, with MPICH 5,
about 100x slower), ``auto`` (``shared`` on one node, else ``allocate``).
"""
from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from psgd.errors import UsageError
from psgd.mpi import wait
from psgd.mpi.phase import phase, rma_lock
from psgd.mpi.roles import Roles
from psgd.mpi.shardmap import ShardMap
from psgd.mpi.shared_memory import allocate_shared, on_one_node

WINDOW_KINDS = ("auto", "shared", "allocate", "create")


def _window_kind(comm: MPI.Intracomm, window: str | None) -> tuple[str, bool]:
    kind = window or os.environ.get("PSGD_X_HOGWILD_WINDOW") or "auto"
    if kind not in WINDOW_KINDS:
        raise UsageError(f"PSGD_X_HOGWILD_WINDOW={kind!r} is not a window kind; choose one of "
                         f"{', '.join(WINDOW_KINDS)}")
    one_node = on_one_node(comm)
    if kind == "auto":
        kind = "shared" if one_node else "allocate"
    if kind == "shared" and not one_node:
        raise ValueError("hogwild window 'shared' needs every rank on one node; "
                         "use 'allocate' or 'auto' across nodes")
    return kind, one_node


class Windows:
    """The two windows of a hogwild run (collective over ``roles.comm``).

    ``params``: server ``s`` holds its shard, ``4 * shard_map.size(s)`` bytes
    (``local`` views it), workers 0 bytes. ``counter``: on rank 0, int64 ``(1 + W,)``:
    the update count, then one finished flag per worker (stall reports name the
    workers still running); a shared window too where ``params`` is. ``shards``, ``count``:
    on workers of a ``shared`` window, a float32 view of every shard and an int64 view of
    the counters. ``tallies`` (elastic hogwild, :mod:`psgd.elastic.hogwild`): W more
    counters, worker ``k``'s applied updates at :meth:`tally_index`.
    """

    def __init__(self, roles: Roles, shard_map: ShardMap, window: str | None,
                 tallies: bool = False) -> None:
        self.tallies = tallies
        with phase("making the hogwild windows"):
            self._make(roles, shard_map, window)

    def tally_index(self, worker: int) -> int:
        """Where worker ``worker``'s count of applied updates is in the counter window
        (``tallies`` only)."""
        return 1 + self.n_workers + worker

    def _make(self, roles: Roles, shard_map: ShardMap, window: str | None) -> None:
        comm = roles.comm
        # the collectives below block, and MPICH's blocking calls spin: a server here early
        # would take a core from workers still importing numba or reading their data
        wait.barrier(comm, "the other ranks to make the hogwild windows")
        self.kind, one_node = _window_kind(comm, window)
        # Measured with MPICH 5 (ch4): RMA to allocated/shared windows on one
        # node completes without the target calling MPI; to created windows
        # it waits on the target's progress engine, as it may across nodes.
        self.target_progress_free = one_node and self.kind != "create"
        n_local = shard_map.size(roles.server_index) if roles.is_server else 0
        nbytes = 4 * n_local
        self.local = None  # this server's shard, as a float32 view of window memory
        if self.kind == "create":
            self.local = np.zeros(n_local, dtype=np.float32)
            self.params = MPI.Win.Create(self.local, 4, comm=comm)
        elif self.kind == "allocate":
            self.params = MPI.Win.Allocate(nbytes, 4, comm=comm)
        else:
            self.params = allocate_shared(comm, nbytes, 4, "the hogwild parameter window",
                                          "PSGD_X_HOGWILD_WINDOW=allocate")
        if self.local is None:
            self.local = np.frombuffer(self.params.tomemory(), dtype=np.float32, count=n_local)
        self.n_workers = roles.n_workers
        # updates, then a finished flag per worker (and, with tallies, an applied count each)
        self.n_counters = 1 + roles.n_workers * (2 if self.tallies else 1)
        counter_bytes = 8 * self.n_counters if comm.Get_rank() == 0 else 0
        if self.kind == "shared":
            self.counter = allocate_shared(comm, counter_bytes, 8, "the hogwild update counter",
                                           "PSGD_X_HOGWILD_WINDOW=allocate")
        else:
            self.counter = MPI.Win.Allocate(counter_bytes, 8, comm=comm)
        # Direct views of every shard (shared windows only, on workers) and of the counters
        # (shared windows, every rank): reads are plain loads, a sparse model's updates CPU
        # atomics (kernels/atomic.py).
        self.shards = self.count = None
        if self.kind == "shared":
            self.count = np.frombuffer(self.counter.Shared_query(0)[0], dtype=np.int64,
                                       count=self.n_counters)
        if self.kind == "shared" and roles.is_worker:
            self.shards = []
            for shard in range(shard_map.n_shards):
                buf, _ = self.params.Shared_query(roles.server_rank(shard))
                self.shards.append(np.frombuffer(buf, dtype=np.float32,
                                                 count=shard_map.size(shard)))

    def read_counters(self) -> np.ndarray:
        """The update counter and the workers' finished flags (outside a lock_all epoch)."""
        out = np.zeros(self.n_counters, dtype=np.int64)
        with rma_lock:
            self.counter.Lock(0, MPI.LOCK_SHARED)
            self.counter.Get(out, 0)
            self.counter.Unlock(0)
        return out

    def any_finished(self) -> bool:
        """Whether some worker has set its finished flag, by a plain load (shared windows; False
        elsewhere, where reading the flags takes MPI calls)."""
        return self.count is not None and bool(self.count[1:].any())

    def describe_running(self, roles: Roles) -> str:
        counters = self.read_counters()
        running = [roles.worker_rank(k) for k in range(roles.n_workers) if not counters[1 + k]]
        return (f"hogwild worker rank(s) {running} to finish their steps (no update in that "
                f"time; {int(counters[0])} updates so far)")

    def progress(self) -> tuple:
        return tuple(self.read_counters().tolist())

    def free(self) -> None:
        self.shards = self.count = None
        self.local = None
        with phase("freeing the hogwild windows"):
            self.params.Free()
            self.counter.Free()
