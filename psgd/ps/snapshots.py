"""A parameter server's part in checkpoints: shards sent to rank 0, which assembles the full state."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.errors import PsgdError
from psgd.mpi import wait as _wait
from psgd.mpi.shardmap import ShardMap
from psgd.ps.messages import TAG_FINAL, TAG_SNAP, _mprobe, pack_shard_state, unpack_shard_state


class Assembly:
    """The state of one clock, as rows (params, then k optimizer state arrays) of the full length.

    Parameters
    ----------
    shard_map : ShardMap
    state_keys : tuple of str
        Names of the optimizer's per-element state arrays, in row order.

    Attributes
    ----------
    rows : ndarray, float32 (1 + k, n)
    have : set of int
        Shards placed so far.
    scalars : dict or None
        The optimizer's scalar state (rank 0's own), once known.
    """

    def __init__(self, shard_map: ShardMap, state_keys: tuple) -> None:
        self.shard_map = shard_map
        self.state_keys = state_keys
        self.rows = np.empty((1 + len(state_keys), shard_map.n), np.float32)
        self.have: set[int] = set()
        self.scalars: dict | None = None

    def place(self, shard: int, rows: np.ndarray) -> None:
        """Copy shard ``shard``'s rows (float32 (1 + k, shard length)) into place."""
        lo, hi = self.shard_map.range(shard)
        if rows.shape != (self.rows.shape[0], hi - lo):
            raise PsgdError(f"state of shard {shard} has shape {rows.shape}, expected "
                            f"{(self.rows.shape[0], hi - lo)}")
        self.rows[:, lo:hi] = rows
        self.have.add(shard)

    @property
    def complete(self) -> bool:
        return len(self.have) == self.shard_map.n_shards and self.scalars is not None

    def full_state(self) -> tuple[np.ndarray, dict]:
        """The full parameters (float32 (n,)) and optimizer state dict (arrays and scalars)."""
        opt_state = {key: self.rows[1 + i] for i, key in enumerate(self.state_keys)}
        opt_state.update(self.scalars or {})
        return self.rows[0], opt_state


class Snapshots:
    """The snapshots of one server rank: sent to rank 0, or (on rank 0) assembled there.

    Rank 0 keeps serving while it assembles: one :class:`Assembly` per clock
    whose shards are not all in, handed to ``on_snapshot(clock=c, params=...,
    opt_state=...)`` when complete.

    Parameters
    ----------
    comm : MPI.Comm
        The job communicator (server s is rank s).
    shard_map : ShardMap
    shard : int
        This server's shard (and rank).
    optimizer : psgd.nn.optim.Optimizer
        This shard's optimizer, whose state goes with the parameters.
    on_snapshot : callable or None
        Rank 0: called with each complete snapshot.
    rule : optional
        The update rule, whose per-element state (``rule.state()``: its staleness
        compensation's) goes with the optimizer's.
    """

    def __init__(self, comm: MPI.Comm, shard_map: ShardMap, shard: int, optimizer,
                 on_snapshot=None, rule=None) -> None:
        self.comm, self.shard_map, self.shard = comm, shard_map, shard
        self.optimizer = optimizer
        self.method_state = rule.state() if rule is not None else {}
        self.state_keys = tuple(optimizer.state_keys) + tuple(self.method_state)
        self.on_snapshot = on_snapshot
        self.assembling: dict[int, Assembly] = {}   # rank 0: clocks being put together
        self.request = None    # the last snapshot sent to rank 0 (other servers)
        self._buf = None
        self.n_snapshots = 0

    def state_arrays(self) -> list:
        """The optimizer's and the method's per-element state arrays (float32, shard length),
        in key order."""
        state = {**self.optimizer.state_dict(), **self.method_state}
        return [np.asarray(state[key], np.float32) for key in self.state_keys]

    def capture(self, clock: int, live: np.ndarray) -> None:
        """Snapshot this shard as it is after clock ``clock`` (rank 0 places its own)."""
        if self.shard == 0:
            self._place_own(self._entry(clock), live)
            self._done(clock)
            return
        self.n_snapshots += 1
        if self.request is not None:
            _wait.wait(self.request, "rank 0 to take the previous snapshot")
        self._buf = pack_shard_state(clock, self.shard, live, self.state_arrays())
        self.request = self.comm.Isend(self._buf, 0, TAG_SNAP)

    def receive(self, msg: MPI.Message, status: MPI.Status) -> None:
        """Rank 0: take another server's snapshot, probed on ``TAG_SNAP``."""
        source = status.Get_source()
        buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        _wait.wait(msg.Irecv(buf), f"the snapshot from server rank {source}")
        clock, shard, rows = unpack_shard_state(buf)
        if shard != source:
            raise PsgdError(f"snapshot from rank {source} names shard {shard}")
        self._entry(clock).place(shard, rows)
        self._done(clock)

    def gather_final(self, version: int, live: np.ndarray) -> tuple:
        """The full final ``(params, opt_state)`` on rank 0 (None, None elsewhere; collective
        over the servers)."""
        if self.shard != 0:
            buf = pack_shard_state(version, self.shard, live, self.state_arrays())
            _wait.wait(self.comm.Isend(buf, 0, TAG_FINAL), "rank 0 to take the final shard")
            return None, None
        entry = Assembly(self.shard_map, self.state_keys)
        self._place_own(entry, live)
        status = MPI.Status()
        for s in range(1, self.shard_map.n_shards):
            msg = _mprobe(self.comm, s, TAG_FINAL, status, f"the final shard of server rank {s}")
            buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            _wait.wait(msg.Irecv(buf), f"the final shard of server rank {s}")
            _, shard, rows = unpack_shard_state(buf)
            entry.place(shard, rows)
        return entry.full_state()

    def _entry(self, clock: int) -> Assembly:
        if clock not in self.assembling:
            self.assembling[clock] = Assembly(self.shard_map, self.state_keys)
        return self.assembling[clock]

    def _place_own(self, entry: Assembly, live: np.ndarray) -> None:
        entry.scalars = {k: v for k, v in self.optimizer.state_dict().items()
                         if k not in self.state_keys}
        entry.place(0, np.stack([live] + self.state_arrays()))

    def _done(self, clock: int) -> None:
        if not self.assembling[clock].complete:
            return
        entry = self.assembling.pop(clock)
        self.n_snapshots += 1
        if self.on_snapshot is not None:
            params, opt_state = entry.full_state()
            self.on_snapshot(clock=clock, params=params, opt_state=opt_state)
