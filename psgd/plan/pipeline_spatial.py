"""Pipeline rows of stages split by rows (ranks = D x K x P, ``psgd train --pipeline K
--spatial P``): each stage's image units over P times the profile's spatial ratio at P, its
halos and gathers per microbatch as :mod:`psgd.tensor.mixed` lists them, P parallel
activation messages between stages, the bubble, and per step the parts' sum of the conv
weights' partial gradients and the replicas' update.  Only cuts whose every stage splits
(:func:`psgd.tensor.spatial_stages.splits`, the run's own check) are searched."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from psgd.pipeline.partition import min_max_cut, units as unit_bounds
from psgd.plan.cost import groups_allreduce_s
from psgd.plan.cut import stage_in_flight
from psgd.plan.pipeline_tensor import SCHEDULES, SplitStages
from psgd.plan.tensor_time import ratio_at

ITEMSIZE = 4        # float32, psgd train's dtype


def stage_collectives(split: list, first: bool, again: float) -> list[tuple[str, object, float, bool]]:
    """``[(kind, values, runs per microbatch, per sample)]`` of one stage's ``split`` layers
    (:func:`psgd.tensor.spatial_stages.rows_split`), as :func:`psgd.tensor.mixed._collectives`
    lists each layer's: a forward halo, gather or batch-norm statistic runs ``again`` times
    (``--recompute on``), an adjoint halo or statistic once; a stage after the first needs
    its input gradient (the adjoint halo of its first conv, and the all-gather of its input
    rows' gradient, sent back whole); the conv weights' partial sums (per step) are the
    update's, listed with runs 0."""
    from psgd.tensor.mixed import _collectives
    from psgd.tensor.residual import SplitResidual
    from psgd.tensor.spatial import GatherHeight, SplitHeight
    out = []

    def walk(layer, first):
        if isinstance(layer, SplitResidual):
            for part in layer.parts:
                walk(part, False)
            if layer.reduce:
                out.append(("all-reduce", int(np.prod(layer.in_shape)), 1.0, True))   # backward
            return
        if isinstance(layer, SplitHeight) and not isinstance(layer, GatherHeight):
            if not first:
                out.append(("all-gather", int(np.prod(layer.in_shape)), 1.0, True))
            return
        halos = stats = 0
        for kind, values, per_sample in _collectives(layer, first):
            if kind == "halo":
                out.append((kind, values, again if halos == 0 else 1.0, True))
                halos += 1
            elif kind == "all-reduce" and not per_sample and np.any(values):
                out.append((kind, values, 0.0, False))      # partial weight gradients: per step
            elif kind == "all-reduce" and not per_sample:    # batch-norm statistics
                out.append((kind, values, again if stats == 0 else 1.0, False))
                stats += 1
            else:
                out.append((kind, values, again, per_sample))

    for layer in split:
        walk(layer, first)
        first = first and not layer.param_shapes()
    return out


class RowStages(SplitStages):
    """:class:`~psgd.plan.pipeline_tensor.SplitStages` for stages split by rows: the
    profile's leading ``spatial_units`` split over P (at the spatial ratio and slow-down at
    P), the rest whole on every part; a stage's collectives from its split layers, priced
    at the stage position where they cost most."""

    def __init__(self, profile, budget, layers, stages, parts, schedule, microbatches, splits=None,
                 priced=None) -> None:
        super().__init__(profile, budget, stages, parts, schedule, microbatches)
        self.ratio = ratio_at(profile.spatial_ratios, parts) * budget.slow(profile, f"spatial {parts}")
        self.layers, self.bounds = layers, unit_bounds(_Layers(layers))
        self._split = {} if splits is None else splits      # [i, j) -> split layers (P's, shared)
        if priced is not None:      # prices of this K, P and M, shared by the schedules
            self._priced = priced

    def split(self, i: int, j: int):
        """(the split layers of units [i, j) as one stage, which of those units run split by
        rows, each unit's output bytes per sample on the part with the most rows), or None
        where they do not split."""
        if (i, j) not in self._split:
            from psgd.tensor.spatial import GatherHeight, SplitHeight
            from psgd.tensor.spatial_stages import RowsComm, rows_split
            a, b = self.bounds[i][0], self.bounds[j - 1][1]
            try:
                out = rows_split((a, b))(list(self.layers[a:b]), RowsComm(0, self.parts))
            except ValueError:
                self._split[i, j] = None
                return None
            rows, real, on = [], [], False        # per serial layer: between a split and a gather
            for layer in out:
                if isinstance(layer, (SplitHeight, GatherHeight)):
                    on = not isinstance(layer, GatherHeight)
                else:
                    rows.append(on)
                    real.append(layer)
            first = [self.bounds[u][0] - a for u in range(i, j)]
            # a split unit's output on part 0, which holds the most rows (its in-place
            # activation keeps the serial shape: the unit's first layer's)
            outs = tuple(ITEMSIZE * int(np.prod(real[f].out_shape)) if rows[f] else u.out_bytes
                         for f, u in zip(first, self.profile.units[i:j]))
            self._split[i, j] = (out, tuple(rows[f] for f in first), outs)
        return self._split[i, j]

    def compute(self, i: int, j: int, last: bool) -> float:
        """Units [i, j) on one microbatch: the forward (and its re-runs) and the backward,
        the units split by rows over P in their per-sample seconds, all times the spatial
        ratio (and the slow-down on shared cores) at P."""
        m, again, (_, rows, _) = self.microbatch, self.again[last], self.split(i, j)
        key = ("compute", i, j, again)
        if key not in self._priced:
            self._priced[key] = self.ratio * sum(
            again * u.forward_fixed_s + u.backward_fixed_s
            + m * (again * u.forward_s + u.backward_s) / (self.parts if split else 1)
            for u, split in zip(self.profile.units[i:j], rows))
        return self._priced[key]

    def price(self, kind: str, nbytes) -> float:
        """One collective in every replica's group of a stage, at the dearest stage position:
        an all-gather as an all-reduce of half its bytes; a halo by each pair's bytes."""
        from psgd.plan.grid import _halo_s
        if kind != "halo":
            return self.collective_s(int(nbytes / 2 if kind == "all-gather" else nbytes))
        key = ("halo", tuple(np.asarray(nbytes).ravel().tolist()))
        if key not in self._priced:
            self._priced[key] = max(_halo_s(self._job, [[self.rank(g, s, r) for r in range(self.parts)]
                                                        for g in range(self.replicas)], nbytes, self.budget.net)
                                    for s in range(self.stages))
        return self._priced[key]

    def collectives(self, i: int, j: int, last: bool) -> list:
        key = ("collectives", i, j, self.again[last])
        if key not in self._split:
            self._split[key] = stage_collectives(self.split(i, j)[0], i == 0, self.again[last])
        return self._split[key]

    def seconds(self, i: int, j: int, last: bool) -> float:
        m, key = self.microbatch, ("stage", i, j, self.again[last])
        if key not in self._priced:
            self._priced[key] = sum(runs * self.price(kind, values * ITEMSIZE * (m if per_sample else 1))
                                    for kind, values, runs, per_sample in self.collectives(i, j, last) if runs)
        return self.compute(i, j, last) + self._priced[key] \
            + (0.0 if last else self.send_s(m * self.profile.units[j - 1].out_bytes))

    def partial_bytes(self, i: int, j: int) -> int:
        """The conv weights' partial gradient bytes the stage's parts sum once a step."""
        return sum(int(np.sum(v)) * ITEMSIZE for kind, v, runs, _ in self.collectives(i, j, False)
                   if kind == "all-reduce" and not runs)


class _Layers:
    def __init__(self, layers) -> None:
        self.layers = layers


def stage_memory(units, microbatch: int, flight: int, parts: int, rows, outs, slots: int,
                 replicated: bool) -> int:
    """One part of a stage split by rows: its whole parameters, gradient and accumulation,
    optimizer state, the replicas' all-reduce buffer, ``flight`` microbatches' whole inputs,
    and one microbatch's outputs (``outs``: each unit's bytes per sample on the part) and
    scratch (that of the units split by ``rows``, a flag each, over ``parts``)."""
    params = sum(u.param_bytes for u in units)
    return ((3 + slots + int(replicated)) * params + flight * microbatch * units[0].in_bytes
            + sum(microbatch * out + u.scratch_at(microbatch) // (parts if split else 1)
                  for u, split, out in zip(units, rows, outs)))


def plan_fields(profile, budget, layers, k: int, p: int, m: int, schedule: str, cap: int | None,
                splits: dict | None = None, priced: dict | None = None) -> dict | None:
    """The fields of a D x K x P pipeline row (kind ``pipeline``, ``parts`` P, ``axis``
    spatial), or None when no cut splits every stage within ``cap`` bytes per rank;
    ``layers``: the profile's model's serial layers; ``splits``: a cache of P's stage
    splits, ``priced``: of K, P and M's prices."""
    d, n = budget.ranks // (k * p), len(profile.units)
    st = RowStages(profile, budget, layers, k, p, schedule, m, splits, priced)
    flight = stage_in_flight(schedule, k, m)

    def mem(i, j, s):
        return budget.fixed(profile, d) + stage_memory(profile.units[i:j], st.microbatch, flight[s], p,
                                                      *st.split(i, j)[1:], budget.slots, d > 1)

    counts = min_max_cut(n, k, lambda i, j, last: st.seconds(i, j, last) if st.split(i, j) else float("inf"),
                         lambda i, j, s: st.split(i, j) is not None and (cap is None or mem(i, j, s) <= cap))
    if counts is None:
        return None
    edges = [sum(counts[:s]) for s in range(k + 1)]
    times = [st.seconds(edges[s], edges[s + 1], s == k - 1) for s in range(k)]
    local = [sum(u.param_bytes for u in profile.units[edges[s]:edges[s + 1]]) for s in range(k)]
    partial = max(st.partial_bytes(edges[s], edges[s + 1]) for s in range(k))
    job = st._job
    update = (st.collective_s(partial) if partial else 0.0) \
        + (groups_allreduce_s(replace(job, n_params=max(1, max(local) // 4)),
                              [[g * k * p + s for g in range(d)] for s in range(k * p)], budget.net)
           if d > 1 else 0.0) + max(local) * profile.step_s_per_byte
    from psgd.plan.cut import schedule_time
    from psgd.plan.grid import wire_share
    span, bubble = schedule_time(times, m, False)
    moved = sum(2 * (p - 1) * runs * wire_share(kind, values * ITEMSIZE * (st.microbatch if per_sample else 1))
                for s in range(k)
                for kind, values, runs, per_sample in st.collectives(edges[s], edges[s + 1], s == k - 1))
    wire = d * (m * (moved + 2 * p * st.microbatch * sum(profile.units[e - 1].out_bytes for e in edges[1:-1]))
                + 2 * (p - 1) * sum(st.partial_bytes(edges[s], edges[s + 1]) for s in range(k))) \
        + 2 * (d - 1) * sum(local) * p
    return {"step_s": span + update, "memory": max(mem(edges[s], edges[s + 1], s) for s in range(k)),
            "wire_bytes": wire, "replicas": d, "stages": k, "microbatches": m, "schedule": schedule,
            "partition": tuple(counts), "parts": p, "bubble": bubble, "axis": "spatial",
            "extra": {"stage_s": [float(x) for x in times], "update_s": float(update)}}


def shapes(profile, ranks: int) -> list[tuple[int, int]]:
    """(K, P) with K >= 2 stages and 2 <= P <= the profile's ``spatial_max`` dividing ``ranks``,
    K no more than the units; none for a model without image units."""
    if not profile.spatial_units:
        return []
    return [(k, p) for k in range(2, len(profile.units) + 1) for p in range(2, profile.spatial_max + 1)
            if ranks % (k * p) == 0]


def rows(profile, budget, cap: int | None, memo: dict | None = None) -> list[dict]:
    """Every D x K x P row: each (K, P) of :func:`shapes`, M dividing the batch (powers of two
    up to 32), gpipe and 1f1b (``--recompute on``, the only one stages split by rows run),
    the cut from :func:`min_max_cut` over the cuts that split, under ``cap``; ``memo``: the
    splits and prices, kept between calls on the same profile and budget."""
    from psgd.plan.grid import serial_layers
    pairs = shapes(profile, budget.ranks)
    if not pairs:
        return []
    layers = serial_layers(profile.spec, profile.input_shape, profile.n_classes)
    if layers is None or len(unit_bounds(_Layers(layers))) != len(profile.units):
        return []
    ms = [m for m in (1, 2, 4, 8, 16, 32) if budget.batch % m == 0]
    out, memo = [], {} if memo is None else memo
    for k, p in pairs:
        for m in ms:
            for schedule in SCHEDULES:
                loose = memo.get(("row", k, p, m, schedule), False)
                if loose is None or loose and cap is not None and loose["memory"] <= cap:
                    row = loose         # no cut splits, or the fastest cut fits the cap
                else:
                    row = plan_fields(profile, budget, layers, k, p, m, schedule, cap, memo.setdefault(p, {}),
                                      memo.setdefault((k, p, m), {}))
                if cap is None:
                    memo["row", k, p, m, schedule] = row
                if row is not None:
                    out.append(row)
    return out
