"""The RMA windows of a hogwild run: where the shards live, and the update counter.

Windows and memory
------------------
Two windows over the job's communicator, each created collectively by all
ranks:

1. the parameter window: server ``s`` holds ``4 * shard_map.size(s)`` bytes
   (its shard), every worker attaches 0 bytes;
2. the counter window: ``8 * (1 + W)`` bytes on rank 0 (int64: the update
   counter, then one finished flag per worker, which stall reports read to
   name the workers still running), 0 bytes elsewhere.

Besides the window, a server keeps nothing during training (a copy of its
shard is made at the end to gather the result on rank 0). A worker holds
the caller's parameter vector plus three float32 work vectors of length
``n_params`` (the updated copy, the delta and the local optimizer state:
none for sgd, one velocity for momentum/nesterov).

The parameter window is made by one of (``window=`` argument, then
``PSGD_HOGWILD_WINDOW``, then ``auto``):

- ``shared``: ``MPI_Win_allocate_shared``. Needs every rank on one node;
  workers read the shards by direct loads from the mapped memory
  (``MPI_Win_shared_query``) instead of ``MPI_Get``, and still update with
  ``MPI_Accumulate``;
- ``allocate``: ``MPI_Win_allocate`` (MPI allocates the memory; MPICH maps it
  shared within a node), reads with ``MPI_Get``; the general path, also
  across nodes;
- ``create``: ``MPI_Win_create`` over a numpy array; correct everywhere but,
  with MPICH 5 (ch4), each RMA call then waits on the server's progress
  engine, i.e. on its poll interval: about 100x slower than ``allocate``;
- ``auto``: ``shared`` when all ranks share a node, else ``allocate``.

Server progress: with MPICH 5 on one node, RMA to ``shared``/``allocate``
windows completes with the server making no MPI call at all (measured:
a server asleep outside MPI did not slow 20 1M-element accumulate+get
rounds), so an idle server polls its end-of-run barrier only every
:data:`psgd.hogwild.hogwild.SERVER_MAX_SLEEP` seconds. For ``create``
windows and across nodes (where the network may not do accumulates in
hardware) it polls with the usual backoff cap, ``PSGD_POLL_MAX_SLEEP``;
lower that if remote updates are slow. Measured on 2 oversubscribed cores, 1M float32 parameters, 2 workers
without compute, 1 server (``bench/bench_hogwild.py``, a machine shared
with other jobs, so +-30% run to run): 180-430 updates/s with ``shared`` and
140-270 with ``allocate``; reading 1M parameters took 0.7-1.2 ms by direct
loads against 1.1-2.2 ms by ``MPI_Get`` in every paired run, and the step is
dominated by the push (a 4 MB accumulate is about 1.2 ms alone; the rest is
the worker's local optimizer pass), so ``auto`` picks ``shared``. The server
used 0.8-2.5% of one core over the run, window setup and final gather
included; ``create`` managed 1.4 updates/s.
"""
from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from psgd.mpi.roles import Roles
from psgd.mpi.shardmap import ShardMap

WINDOW_KINDS = ("auto", "shared", "allocate", "create")


def _window_kind(comm: MPI.Intracomm, window: str | None) -> tuple[str, bool]:
    kind = window or os.environ.get("PSGD_HOGWILD_WINDOW") or "auto"
    if kind not in WINDOW_KINDS:
        raise ValueError(f"unknown hogwild window kind {kind!r}; choose one of "
                         f"{', '.join(WINDOW_KINDS)}")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    one_node = node.Get_size() == comm.Get_size()
    node.Free()
    if kind == "auto":
        kind = "shared" if one_node else "allocate"
    if kind == "shared" and not one_node:
        raise ValueError("hogwild window 'shared' needs every rank on one node; "
                         "use 'allocate' or 'auto' across nodes")
    return kind, one_node


class Windows:
    """The two windows of a hogwild run (collective over ``roles.comm``)."""

    def __init__(self, roles: Roles, shard_map: ShardMap, window: str | None) -> None:
        comm = roles.comm
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
            self.params = MPI.Win.Allocate_shared(nbytes, 4, comm=comm)
        if self.local is None:
            self.local = np.frombuffer(self.params.tomemory(), dtype=np.float32, count=n_local)
        self.n_counters = 1 + roles.n_workers  # updates, then a finished flag per worker
        self.counter = MPI.Win.Allocate(8 * self.n_counters if comm.Get_rank() == 0 else 0, 8,
                                        comm=comm)
        # Direct views of every shard (shared windows only): reads are plain loads.
        self.shards = None
        if self.kind == "shared" and roles.is_worker:
            self.shards = []
            for shard in range(shard_map.n_shards):
                buf, _ = self.params.Shared_query(roles.server_rank(shard))
                self.shards.append(np.frombuffer(buf, dtype=np.float32,
                                                 count=shard_map.size(shard)))

    def read_counters(self) -> np.ndarray:
        """The update counter and the workers' finished flags (outside a lock_all epoch)."""
        out = np.zeros(self.n_counters, dtype=np.int64)
        self.counter.Lock(0, MPI.LOCK_SHARED)
        self.counter.Get(out, 0)
        self.counter.Unlock(0)
        return out

    def describe_running(self, roles: Roles) -> str:
        counters = self.read_counters()
        running = [roles.worker_rank(k) for k in range(roles.n_workers) if not counters[1 + k]]
        return (f"hogwild worker rank(s) {running} to finish their steps (no update in that "
                f"time; {int(counters[0])} updates so far)")

    def progress(self) -> tuple:
        return tuple(self.read_counters().tolist())

    def free(self) -> None:
        self.shards = None
        self.local = None
        self.params.Free()
        self.counter.Free()
