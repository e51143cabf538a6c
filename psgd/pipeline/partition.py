"""Cutting a model's layers into K contiguous stages: by given counts, or PipeDream's dynamic program."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from psgd.pipeline.schedules import recomputed


@dataclass(frozen=True)
class UnitCost:
    """One unit (a layer, with an in-place activation after it) on one microbatch."""

    seconds: float        # forward plus backward
    in_bytes: int         # its input activation
    out_bytes: int        # its output activation
    param_bytes: int
    forward: float = 0.0  # the forward alone


def units(model) -> list[tuple[int, int]]:
    """The model's cuttable units as layer ranges ``[a, b)``; a residual block is one layer.

    An in-place activation stays with the layer before it (it overwrites that layer's
    output, which a stage boundary would hand to another rank).
    """
    starts = [i for i, layer in enumerate(model.layers) if i == 0 or not getattr(layer, "inplace", False)]
    return list(zip(starts, starts[1:] + [len(model.layers)]))


def layer_bounds(model, counts: list[int]) -> list[tuple[int, int]]:
    """Each stage's layer range ``[a, b)`` for ``counts`` units per stage."""
    us = units(model)
    if sum(counts) != len(us):
        raise ValueError(f"--partition {','.join(map(str, counts))} covers {sum(counts)} layer "
                         f"units, but model {model.spec} has {len(us)}")
    edges = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    return [(us[lo][0], us[hi - 1][1]) for lo, hi in zip(edges[:-1], edges[1:])]


def check_stages(model, stages: int) -> None:
    n = len(units(model))
    if stages > n:
        raise ValueError(f"--pipeline {stages} is more stages than model {model.spec}'s {n} "
                         f"layer units (each stage needs at least one)")


def time_unit(layers: list, x: np.ndarray, repeats: int) -> tuple[float, float, np.ndarray]:
    """(the fastest forward and backward seconds, the fastest forward seconds, the output) of
    ``layers`` on ``x`` in train mode, over ``repeats`` runs."""
    best, fwd, out = np.inf, np.inf, x
    for _ in range(repeats):
        t = time.perf_counter()
        out = x
        for layer in layers:
            layer.set_mode("train")
            out = layer.forward(out)
        t1 = time.perf_counter()
        dy = np.ones_like(out) / out.size
        for layer in reversed(layers):
            dy = layer.backward(dy, need_dx=True)
        best, fwd = min(best, time.perf_counter() - t), min(fwd, t1 - t)
    return best, fwd, out


def profile(model, microbatch: int, repeats: int = 3, seed: int = 0,
            unit_model=None) -> list[UnitCost]:
    """Time each unit's forward and backward on a random microbatch (best of ``repeats``).

    ``unit_model(a, b)``, when given, makes a model whose layers ``[a, b)`` have parameters
    (:class:`psgd.pipeline.local.StageModel`): one unit is allocated at a time, so a model
    larger than the rank's memory is profiled too.
    """
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((microbatch, *model.input_shape)).astype(model.dtype)
    costs = []
    for lo, hi in units(model):
        owner = model if unit_model is None else unit_model(lo, hi)
        layers = owner.layers[lo:hi]
        best, fwd, out = time_unit(layers, a, repeats)
        out = out.copy()
        costs.append(UnitCost(best, a.nbytes, out.nbytes, model.dtype.itemsize * sum(
            int(np.prod(s)) for layer in layers for _, s in layer.param_shapes()), fwd))
        a = out
    return costs


def stage_memory(costs: list[UnitCost], in_flight: int, keep: bool = False) -> int:
    """Bytes a stage holds: parameters, gradient and its accumulation, ``in_flight`` stored
    inputs, and one microbatch's activations inside it (``keep``: each stored one's)."""
    return (3 * sum(c.param_bytes for c in costs) + in_flight * costs[0].in_bytes
            + (in_flight if keep else 1) * sum(c.out_bytes for c in costs))


def stage_time(costs: list[UnitCost], seconds_per_byte: float, last: bool,
               recompute: tuple[float, float] = (0.0, 0.0)) -> float:
    """A stage's compute per microbatch plus sending its output and receiving its gradient.

    ``recompute``: the share of microbatches whose forward runs again before the backward,
    on the stages before the last and on the last (:func:`recompute_shares`).
    """
    send = 0.0 if last else 2 * costs[-1].out_bytes * seconds_per_byte
    again = recompute[1] if last else recompute[0]
    return sum(c.seconds + again * c.forward for c in costs) + send


def recompute_shares(schedule: str, stages: int, microbatches: int) -> tuple[float, float]:
    """The share of forwards run twice under ``--recompute on``: stage 0's, the last stage's
    (under gpipe and 1f1b every stage before the last is as stage 0)."""
    return tuple(recomputed(schedule, stages, s, microbatches) / microbatches
                 for s in (0, stages - 1))


def min_max_cut(n: int, stages: int, seconds, fits) -> list[int] | None:
    """PipeDream's dynamic program over contiguous cuts of ``n`` units: unit counts per stage
    minimising the slowest stage, or None when no cut fits.

    ``seconds(i, j, last)``: the stage holding units ``[i, j)``; ``fits(i, j, k)``: whether
    those units fit as stage ``k``.  O(K n^2) calls.
    """
    inf = float("inf")
    # best[k][j]: the slowest of stages 0..k-1 holding units [0, j); cut[k][j]: where stage k-1 starts
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for j in range(k, n - (stages - k) + 1):
            for i in range(k - 1, j):
                if best[k - 1][i] == inf or not fits(i, j, k - 1):
                    continue
                t = max(best[k - 1][i], seconds(i, j, j == n))
                if t < best[k][j]:
                    best[k][j], cut[k][j] = t, i
    if best[stages][n] == inf:
        return None
    counts, j = [], n
    for k in range(stages, 0, -1):
        counts.append(j - cut[k][j])
        j = cut[k][j]
    return counts[::-1]


def best_cut(costs: list[UnitCost], stages: int, in_flight, memory: int | None = None,
             seconds_per_byte: float = 0.0, recompute: tuple[float, float] = (0.0, 0.0),
             keep: bool = False) -> list[int]:
    """:func:`min_max_cut` over measured unit costs: unit counts per stage minimising the
    slowest stage (``recompute``: see :func:`stage_time`; ``keep``: the stages keep every
    stored microbatch's activations, ``--recompute off``).

    ``in_flight(s)``: stored microbatches on stage ``s`` (the schedule's bound), for the
    memory cap ``memory`` (bytes per rank; None: none).  Raises ValueError when no cut fits.
    """
    counts = min_max_cut(
        len(costs), stages,
        lambda i, j, last: stage_time(costs[i:j], seconds_per_byte, last, recompute),
        lambda i, j, k: memory is None or stage_memory(costs[i:j], in_flight(k), keep) <= memory)
    if counts is None:
        need = max(stage_memory([c], in_flight(0)) for c in costs)
        raise ValueError(f"no cut into {stages} stages fits --memory-per-rank {memory} bytes "
                         f"(the largest single unit alone needs {need})")
    return counts


def slowest(costs: list[UnitCost], counts: list[int], seconds_per_byte: float = 0.0,
            recompute: tuple[float, float] = (0.0, 0.0)) -> float:
    """The slowest stage's time per microbatch under ``counts``."""
    edges = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    return max(stage_time(costs[a:b], seconds_per_byte, b == len(costs), recompute)
               for a, b in zip(edges[:-1], edges[1:]))
