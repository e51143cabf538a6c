"""The workers' graphs for gossip: neighbours per topology and their mixing matrix (pure numpy).

Every topology is a regular graph on W workers, and its mixing matrix gives
each worker and each of its d neighbours the weight 1/(d + 1) (the
Metropolis-Hastings weights of a regular graph), so it is symmetric and doubly
stochastic:

- ``ring``: i - 1 and i + 1 (mod W).
- ``torus``: an R x C grid wrapped both ways, R x C = W with R, C >= 2 and R the
  largest such divisor <= sqrt(W); the four grid neighbours.
- ``exponential``: i +- 2^k (mod W) for 2^k < W (log2 W hops between any two).
- ``complete``: every other worker (one gossip step is the exact average).
"""
from __future__ import annotations

import math

import numpy as np

from psgd.errors import UsageError

TOPOLOGIES = ("ring", "torus", "exponential", "complete")
DEFAULT = "ring"


def torus_shape(n: int) -> tuple[int, int]:
    """(R, C) with R x C = n, 2 <= R <= C and R as large as possible; ValueError if none."""
    for rows in range(math.isqrt(n), 1, -1):
        if n % rows == 0:
            return rows, n // rows
    raise UsageError(f"--topology torus needs W = R x C workers with R, C >= 2, but W = {n} "
                     f"is not such a product (use ring, exponential or complete)")


def neighbours(name: str, n: int) -> list[list[int]]:
    """Each worker's neighbours (sorted, without itself) on topology ``name`` of ``n`` workers.

    Raises
    ------
    ValueError
        An unknown topology, or one impossible for ``n`` (a torus of a prime W).
    """
    if name not in TOPOLOGIES:
        raise UsageError(f"--topology {name!r} is not one of {', '.join(TOPOLOGIES)}")
    if n < 1:
        raise UsageError(f"a topology needs at least one worker, got {n}")
    if name == "ring":
        offsets = [(i, (i + s) % n) for i in range(n) for s in (-1, 1)]
    elif name == "exponential":
        hops = [2 ** k for k in range(max(n - 1, 1).bit_length()) if 2 ** k < n]
        offsets = [(i, (i + s * h) % n) for i in range(n) for h in hops for s in (-1, 1)]
    elif name == "complete":
        offsets = [(i, j) for i in range(n) for j in range(n)]
    else:
        rows, cols = torus_shape(n)
        offsets = []
        for i in range(n):
            r, c = divmod(i, cols)
            offsets += [(i, ((r + dr) % rows) * cols + (c + dc) % cols)
                        for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))]
    found: list[set[int]] = [set() for _ in range(n)]
    for i, j in offsets:
        if i != j:
            found[i].add(j)
    return [sorted(s) for s in found]


def mixing_matrix(name: str, n: int) -> np.ndarray:
    """The (n, n) float64 mixing matrix of topology ``name``: 1/(d + 1) on self and each neighbour.

    Raises
    ------
    ValueError
        As :func:`neighbours`.
    """
    adjacent = neighbours(name, n)
    matrix = np.zeros((n, n))
    for i, near in enumerate(adjacent):
        weight = 1.0 / (len(near) + 1)
        matrix[i, [i, *near]] = weight
    return matrix
