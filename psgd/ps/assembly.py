"""Rank 0's assembly of the full parameter vector and optimizer state from the servers' shards.

Used for snapshots (one :class:`Assembly` per clock being put together, while
rank 0 keeps serving) and for the final gather at the end of a run.
"""
from __future__ import annotations

import numpy as np

from psgd.errors import PsgdError
from psgd.mpi.shardmap import ShardMap


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
