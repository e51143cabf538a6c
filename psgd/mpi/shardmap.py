"""The shard map: the flat parameter vector cut into S contiguous near-equal ranges."""
from __future__ import annotations

import numpy as np


class ShardMap:
    """Cut ``n`` parameters into ``n_shards`` contiguous ranges, the same on every rank.

    Shard ``s`` holds ``[bounds[s], bounds[s+1])``; the first ``n % S`` shards
    are one element longer than the rest.

    Parameters
    ----------
    n : int
        Length of the flat parameter vector.
    n_shards : int
        Number of server ranks S >= 1.
    """

    def __init__(self, n: int, n_shards: int) -> None:
        if n_shards < 1:
            raise ValueError(f"a shard map needs at least one shard, got {n_shards}")
        if n < 0:
            raise ValueError(f"parameter count must be >= 0, got {n}")
        self.n = int(n)
        self.n_shards = int(n_shards)
        base, extra = divmod(self.n, self.n_shards)
        sizes = np.full(self.n_shards, base, dtype=np.int64)
        sizes[:extra] += 1
        self.bounds = np.zeros(self.n_shards + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.bounds[1:])

    def range(self, shard: int) -> tuple[int, int]:
        """``(lo, hi)`` of ``shard``."""
        return int(self.bounds[shard]), int(self.bounds[shard + 1])

    def size(self, shard: int) -> int:
        """Number of parameters in ``shard``."""
        return int(self.bounds[shard + 1] - self.bounds[shard])

    def view(self, vector: np.ndarray, shard: int) -> np.ndarray:
        """The slice of ``vector`` (length n) that ``shard`` owns, as a view."""
        lo, hi = self.range(shard)
        return vector[lo:hi]

    def own(self, values, shard: int, what: str = "values") -> np.ndarray:
        """``values`` as a float32 vector of ``shard``'s length: its own, or its slice of a full vector.

        May be a view of ``values``.  Raises ValueError naming ``what`` for any other length.
        """
        arr = np.asarray(values, dtype=np.float32).ravel()
        m = self.size(shard)
        if arr.shape[0] == self.n and self.n != m:
            arr = self.view(arr, shard)
        if arr.shape[0] != m:
            raise ValueError(f"shard {shard}: {what} has {arr.shape[0]} values, expected {m} "
                             f"(or the full {self.n})")
        return arr

    def __repr__(self) -> str:
        return f"ShardMap(n={self.n}, n_shards={self.n_shards})"
