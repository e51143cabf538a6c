"""Pipeline rows of tensor-split stages (ranks = D x K x T, ``psgd train --pipeline K --tensor
T``): each stage's split units over T times the profile's ratio at T, its collectives per
microbatch, T parallel activation messages between stages, the bubble, the replicas' update."""
from __future__ import annotations

from dataclasses import replace

from psgd.pipeline.partition import min_max_cut
from psgd.pipeline.schedules import recomputed
from psgd.plan.cost import Job, Traffic, groups_allreduce_s
from psgd.plan.cut import schedule_time, stage_in_flight
from psgd.plan.tensor_comm import tensor_collectives
from psgd.plan.tensor_time import ratio_at

SCHEDULES = ("gpipe", "1f1b")      # psgd.tensor.pipeline.SCHEDULES (no MPI import here)


class _Input(int):
    """A unit's input bytes, marked: an all-reduce of them is an input gradient's (backward)."""


def stage_collectives(units, first: bool, again: float = 1.0) -> list[tuple[str, int, float]]:
    """``[(kind, bytes per sample, runs per microbatch)]`` of a stage of ``units`` split by
    ``split_tensor(close=True)``: a stage after the first all-reduces its first column's input
    gradient (it is sent back whole); a forward collective runs ``again`` times (the forward
    re-runs before a backward that does not follow it at once: ``--recompute on``)."""
    marked = [replace(u, in_bytes=_Input(u.in_bytes)) for u in units]
    if not first:     # a stand-in unit with parameters: the first real one is not the model's first
        marked.insert(0, replace(units[0], name="input", param_bytes=1, split_bytes=0))
    return [(kind, int(n), 1.0 if kind == "all-reduce" and isinstance(n, _Input) else again)
            for kind, n in tensor_collectives(marked)]


def stage_params(units, parts: int) -> int:
    """A part's parameter bytes of a stage: split ones over ``parts``, the rest whole."""
    split = sum(u.split_bytes for u in units)
    return sum(u.param_bytes for u in units) - split + -(-split // parts)


def stage_memory(units, microbatch: int, flight: int, parts: int, slots: int, replicated: bool) -> int:
    """One part of a stage: parameters, gradient and its accumulation, optimizer state, the
    replicas' all-reduce buffer, ``flight`` microbatches' inputs and one microbatch's
    activations and scratch (split units' 1/``parts``)."""
    return ((3 + slots + int(replicated)) * stage_params(units, parts)
            + flight * microbatch * units[0].in_bytes
            + sum((microbatch * u.out_bytes + u.scratch_at(microbatch)) // (parts if u.split_bytes else 1)
                  for u in units))


class SplitStages:
    """Stage prices of ``profile`` on D x K x T ranks of ``budget``, ``schedule`` over
    ``microbatches`` of the batch (rank r: part r % T of stage (r // T) % K of replica
    r // (KT), as the run lays them out); a collective or a send is priced at the stage
    position where it costs most. A stage's forward runs 1 + r / M times per microbatch, r
    its backwards that re-run it (:func:`psgd.pipeline.schedules.recomputed`: under gpipe
    and 1f1b every stage but 1f1b's last has the same r)."""

    def __init__(self, profile, budget, stages: int, parts: int, schedule: str, microbatches: int) -> None:
        self.profile, self.budget, self.stages, self.parts = profile, budget, stages, parts
        self.microbatch, self.replicas = budget.batch // microbatches, budget.ranks // (stages * parts)
        self.again = {last: 1 + recomputed(schedule, stages, stages - 1 if last else 0, microbatches)
                      / microbatches for last in (False, True)}
        self.ratio = ratio_at(profile.tensor_ratios, parts, profile.tensor_ratio) \
            * budget.slow(profile, f"tensor {parts}")
        self._job = Job(1, 0.0, 1, budget.ranks, 0, budget.per_node, budget.cliques)
        self._priced: dict = {}

    def rank(self, replica: int, stage: int, part: int) -> int:
        return (replica * self.stages + stage) * self.parts + part

    def compute(self, i: int, j: int, last: bool) -> float:
        """Units [i, j) on one microbatch: the forward (and its re-runs) and the backward,
        split units over T, all times the ratio (and the slow-down on shared cores) at T."""
        m, again = self.microbatch, self.again[last]
        return self.ratio * sum((again * u.forward_at(m) + u.backward_at(m)) / (self.parts if u.split_bytes else 1)
                                for u in self.profile.units[i:j])

    def collective_s(self, nbytes: int) -> float:
        """An all-reduce of ``nbytes`` in every replica's T group of a stage at once."""
        if ("group", nbytes) not in self._priced:
            job = replace(self._job, n_params=max(1, nbytes // 4))
            self._priced["group", nbytes] = max(groups_allreduce_s(job, [
                [self.rank(g, s, r) for r in range(self.parts)] for g in range(self.replicas)],
                self.budget.net) for s in range(self.stages))
        return self._priced["group", nbytes]

    def send_s(self, nbytes: int) -> float:
        """A stage's output to the next stage and its gradient back: each of the T parts
        sends the whole activation to its own part, every replica at once."""
        if ("send", nbytes) not in self._priced:
            worst = 0.0
            for s in range(self.stages - 1):
                there, back = Traffic(self._job), Traffic(self._job)
                for g in range(self.replicas):
                    for r in range(self.parts):
                        a = self.rank(g, s, r)
                        there.carry(a, a + self.parts, nbytes)
                        back.carry(a + self.parts, a, nbytes)
                worst = max(worst, there.seconds(self.budget.net, 1) + back.seconds(self.budget.net, 1))
            self._priced["send", nbytes] = worst
        return self._priced["send", nbytes]

    def seconds(self, i: int, j: int, last: bool) -> float:
        """The stage of units [i, j) per microbatch: compute, its collectives (an all-gather
        as an all-reduce of half its bytes, as the tensor rows price it), its sends."""
        m, units = self.microbatch, self.profile.units
        comm = sum(runs * self.collective_s(m * (n if kind == "all-reduce" else n // 2))
                   for kind, n, runs in stage_collectives(units[i:j], i == 0, self.again[last]))
        return self.compute(i, j, last) + comm + (0.0 if last else self.send_s(m * units[j - 1].out_bytes))


def plan_fields(profile, budget, k: int, t: int, m: int, schedule: str, cap: int | None) -> dict | None:
    """The fields of a D x K x T pipeline row (kind ``pipeline``, ``parts`` T), or None when
    no cut fits ``cap`` bytes per rank (None: no cap)."""
    d, n = budget.ranks // (k * t), len(profile.units)
    st = SplitStages(profile, budget, k, t, schedule, m)
    flight = stage_in_flight(schedule, k, m)

    def mem(i, j, s):
        return budget.fixed(profile, d) + stage_memory(profile.units[i:j], st.microbatch, flight[s], t,
                                                      budget.slots, d > 1)

    counts = min_max_cut(n, k, st.seconds, lambda i, j, s: cap is None or mem(i, j, s) <= cap)
    if counts is None:
        return None
    edges = [sum(counts[:s]) for s in range(k + 1)]
    times = [st.seconds(edges[s], edges[s + 1], s == k - 1) for s in range(k)]
    local = [stage_params(profile.units[edges[s]:edges[s + 1]], t) for s in range(k)]
    replicas = [[g * k * t + s for g in range(d)] for s in range(k * t)]
    job = Job(1, 0.0, 1, budget.ranks, 0, budget.per_node, budget.cliques)
    update = (groups_allreduce_s(replace(job, n_params=max(1, max(local) // 4)), replicas, budget.net)
              if d > 1 else 0.0) + max(local) * profile.step_s_per_byte
    span, bubble = schedule_time(times, m, False)
    moved = sum(2 * st.microbatch * n * runs * (t - 1) * (1 if kind == "all-reduce" else 0.5)
                for s in range(k) for kind, n, runs in
                stage_collectives(profile.units[edges[s]:edges[s + 1]], s == 0, st.again[s == k - 1]))
    wire = d * m * (moved + 2 * t * st.microbatch * sum(profile.units[e - 1].out_bytes for e in edges[1:-1])) \
        + 2 * (d - 1) * sum(local) * t
    return {"step_s": span + update, "memory": max(mem(edges[s], edges[s + 1], s) for s in range(k)),
            "wire_bytes": wire, "replicas": d, "stages": k, "microbatches": m, "schedule": schedule,
            "partition": tuple(counts), "parts": t, "bubble": bubble,
            "extra": {"stage_s": [float(x) for x in times], "update_s": float(update)}}


def shapes(profile, ranks: int) -> list[tuple[int, int]]:
    """(K, T) with K >= 2 stages and T >= 2 parts dividing ``ranks``, T no wider than the
    narrowest split layer, K no more than the units."""
    split = [u for u in profile.units if u.split_bytes]
    if not split:
        return []
    widest = min(u.width for u in split)
    return [(k, t) for k in range(2, len(profile.units) + 1) for t in range(2, widest + 1)
            if ranks % (k * t) == 0]


def rows(profile, budget, cap: int | None) -> list[dict]:
    """Every D x K x T row: each (K, T) of :func:`shapes`, M dividing the batch (powers of two
    up to 32), gpipe and 1f1b, the cut from :func:`min_max_cut` under ``cap``."""
    ms = [m for m in (1, 2, 4, 8, 16, 32) if budget.batch % m == 0]
    out = []
    for k, t in shapes(profile, budget.ranks):
        for m in ms:
            for schedule in SCHEDULES:
                row = plan_fields(profile, budget, k, t, m, schedule, cap)
                if row is not None:
                    out.append(row)
    return out
