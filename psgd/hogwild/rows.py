"""Row kernels on the shared shards of a hogwild window: copies, CPU-atomic adds, the counter.

Shard s of a ``shards`` tuple holds the coordinates ``[bounds[s], bounds[s + 1])`` of the flat
vector; row r of length k is the coordinates ``[r * k, r * k + k)``.
"""
from __future__ import annotations

from numba import njit

from psgd.kernels.atomic import atomic_add, atomic_add_pair, atomic_load


@njit(cache=True)
def copy_rows(dst, shards, bounds, rows, k):
    """``dst`` at the coordinates of the k-long ``rows`` = the shared ``shards``' values there
    (shard s holds the coordinates ``[bounds[s], bounds[s + 1])``)."""
    for s in range(len(shards)):
        src, lo, hi = shards[s], bounds[s], bounds[s + 1]
        for r in rows:
            for c in range(max(r * k, lo), min(r * k + k, hi)):
                dst[c] = src[c - lo]


@njit(cache=True)
def add_row(shards, bounds, r, k, values, v):
    """Atomically add ``values[v:v + k]`` into row ``r`` (k long) of the shared ``shards``
    (a tuple of float32 arrays; shard s holds the coordinates ``[bounds[s], bounds[s + 1])``)."""
    c = r * k
    s = 0
    while bounds[s + 1] <= c:
        s += 1
    if c + k <= bounds[s + 1]:   # the row lies in one shard: two elements per atomic
        shard, at = shards[s], c - bounds[s]
        j = 0
        if (shard.ctypes.data + 4 * at) % 8:
            atomic_add(shard, at, values[v])
            j = 1
        while j + 1 < k:
            atomic_add_pair(shard, at + j, values[v + j], values[v + j + 1])
            j += 2
        if j < k:
            atomic_add(shard, at + j, values[v + j])
        return
    for j in range(k):
        t = s
        while bounds[t + 1] <= c + j:
            t += 1
        atomic_add(shards[t], c + j - bounds[t], values[v + j])


@njit(cache=True)
def add_rows(shards, bounds, rows, k, values):
    """Atomically add ``values`` (the k-long ``rows`` in order, flat) into the shared ``shards``."""
    for m in range(rows.size):
        add_row(shards, bounds, rows[m], k, values, m * k)


@njit(cache=True)
def copy_row(dst, shards, bounds, r, k):
    """``dst`` at the coordinates of row ``r`` (k long) = the shared ``shards``' values there."""
    s = 0
    for c in range(r * k, r * k + k):
        while bounds[s + 1] <= c:
            s += 1
        dst[c] = shards[s][c - bounds[s]]


@njit(cache=True)
def add_dense(shards, bounds, values):
    """Atomically add the whole vector ``values`` into the shared ``shards``."""
    for s in range(len(shards)):
        lo = bounds[s]
        for c in range(bounds[s + 1] - lo):
            atomic_add(shards[s], c, values[lo + c])


@njit(cache=True)
def fetch_add(count, i, v):
    """``count[i] += v`` atomically; the value before."""
    return atomic_add(count, i, v)


@njit(cache=True)
def load(count, i):
    """``count[i]``, read whole."""
    return atomic_load(count, i)
