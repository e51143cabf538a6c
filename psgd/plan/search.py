"""The search behind `psgd plan --auto`: data-parallel rows of every protocol, pipelines D x K
(cut by dynamic program) and tensor splits D x T, those over the memory cap dropped, fastest first."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from psgd.errors import UsageError
from psgd.pipeline.schedules import ASYNCHRONOUS, SCHEDULES
from psgd.plan import memory
from psgd.plan.cost import Job, Network, flat_allreduce_s, predict
from psgd.pipeline.partition import min_max_cut
from psgd.plan.cut import Stages, schedule_time, stage_in_flight
from psgd.plan.profile import Profile


@dataclass(frozen=True)
class Budget:
    """What the search may use: ranks, bytes per rank, the network, the batch per replica."""

    ranks: int
    memory: int
    net: Network
    per_node: int = 1
    batch: int = 64
    optimizer: str = "sgd"

    @property
    def slots(self) -> int:
        return memory.OPTIMIZER_SLOTS[self.optimizer]


@dataclass(frozen=True)
class Plan:
    """One way to run: ``kind`` data, pipeline or tensor; D = ``replicas`` (the workers of a
    data plan), K ``stages``, T ``parts``; predicted seconds per step, bytes per rank, idle
    fraction of the pipeline, bytes on the wire per step; ``sync``: the arithmetic is
    serial SGD's on the union of the batches, else ``staleness`` steps expected."""

    kind: str
    protocol: str
    ranks: int
    batch: int
    step_s: float
    memory: int
    wire_bytes: float
    replicas: int = 1
    servers: int = 0
    stages: int = 1
    microbatches: int = 1
    schedule: str = ""
    partition: tuple[int, ...] = ()
    parts: int = 1
    bubble: float = 0.0
    sync: bool = True
    staleness: float = 0.0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def samples_per_s(self) -> float:
        return self.replicas * self.batch / self.step_s

    def train_args(self) -> list[str]:
        """The ``psgd train`` flags that run this plan (model and data not included)."""
        args = ["--protocol", self.protocol, "--batch-size", str(self.batch)]
        if self.servers:
            args += ["--servers", str(self.servers)]
        if self.kind == "pipeline":
            args += ["--pipeline", str(self.stages), "--microbatches", str(self.microbatches),
                     "--schedule", self.schedule, "--partition", ",".join(map(str, self.partition))]
        if self.kind == "tensor":
            args += ["--grid", f"{self.replicas},{self.parts}"]
        return args

    def label(self) -> str:
        if self.kind == "pipeline":
            return (f"pipeline {self.replicas}x{self.stages} {self.schedule} M={self.microbatches} "
                    f"cut {','.join(map(str, self.partition))}")
        if self.kind == "tensor":
            return f"tensor {self.replicas}x{self.parts}"
        return f"{self.extra.get('row', self.protocol)} W={self.replicas} S={self.servers}"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _server_counts(ranks: int) -> list[int]:
    return sorted({s for s in (1, ranks // 4, ranks // 2) if 1 <= s < ranks})


def data_plans(profile: Profile, budget: Budget) -> list[Plan]:
    """Every protocol's rows (psgd plan's cost model) at S = 0 and a few server counts."""
    from psgd.protocols import get
    n_params, p = profile.param_bytes // 4, profile.param_bytes
    plans = []
    for servers in [0] + _server_counts(budget.ranks):
        w = budget.ranks - servers
        job = Job(n_params, profile.compute_s, budget.batch, w, servers, budget.per_node)
        for row, r in predict(job, budget.net).items():
            entry = get(row.split()[0])
            if bool(entry.servers) != bool(servers):
                continue
            if servers:
                mem = max(memory.ps_worker(profile, budget.batch),
                          memory.ps_server(profile, servers, w, budget.slots, 0))
            else:
                mem = memory.allreduce_worker(profile, budget.batch, budget.slots)
            wire = 2 * (w - 1) * p if r["sync"] and not servers else 2 * w * p
            stale = 0.0 if r["sync"] else float(min(w - 1, entry.bound if entry.bound is not None
                                                    else w - 1))
            plans.append(Plan("data", entry.name, budget.ranks, budget.batch, r["step_s"], mem,
                              wire, replicas=w, servers=servers, sync=r["sync"], staleness=stale,
                              extra={"row": row}))
    return plans


def _link_s_per_byte(budget: Budget, group: int) -> float:
    """A group of ``group`` consecutive ranks talks over shared memory when one node holds it."""
    bw = budget.net.shm_bandwidth if budget.per_node >= group else budget.net.bandwidth
    return 1.0 / bw


def _replica_allreduce_s(budget: Budget, nbytes: float, stride: int, replicas: int) -> float:
    job = Job(max(1, int(nbytes // 4)), 0.0, 1, budget.ranks, 0, budget.per_node)
    return flat_allreduce_s(job, [r * stride for r in range(replicas)], budget.net)


def _pipeline_plan(profile: Profile, budget: Budget, k: int, m: int, schedule: str,
                   cap: int | None) -> Plan | None:
    d, asynchronous = budget.ranks // k, schedule in ASYNCHRONOUS
    flight = stage_in_flight(schedule, k, m)
    st = Stages(profile, budget.batch // m, _link_s_per_byte(budget, k), budget.net.latency,
                rerun=max(flight) > 1)

    def mem(i, j, s):
        return st.memory(i, j, flight[s], budget.slots, asynchronous, d > 1)

    counts = min_max_cut(len(profile.units), k, st.seconds,
                      lambda i, j, s: cap is None or mem(i, j, s) <= cap)
    if counts is None:
        return None
    edges = [sum(counts[:s]) for s in range(k + 1)]
    times = [st.seconds(edges[s], edges[s + 1], s == k - 1) for s in range(k)]
    stage_bytes = [sum(u.param_bytes for u in profile.units[edges[s]:edges[s + 1]]) for s in range(k)]
    update = max(_replica_allreduce_s(budget, b, k, d) if d > 1 else 0.0 for b in stage_bytes) \
        + max(stage_bytes) * profile.step_s_per_byte
    span, bubble = schedule_time(times, m, asynchronous)
    step = span + (m if asynchronous else 1) * update
    wire = d * 2 * st.microbatch * m * sum(profile.units[e - 1].out_bytes for e in edges[1:-1]) \
        + 2 * (d - 1) * profile.param_bytes * (m if asynchronous else 1)
    return Plan("pipeline", "allreduce", budget.ranks, budget.batch, step,
                max(mem(edges[s], edges[s + 1], s) for s in range(k)), wire, replicas=d,
                stages=k, microbatches=m, schedule=schedule, partition=tuple(counts),
                bubble=bubble, sync=not asynchronous, staleness=float(k - 1) if asynchronous else 0.0)


def pipeline_plans(profile: Profile, budget: Budget, cap: int | None) -> list[Plan]:
    """D x K for each K dividing the ranks, M dividing the batch (powers of two up to 32), each
    schedule; the cut from :func:`min_max_cut` under ``cap`` bytes per rank (None: no cap)."""
    plans = []
    ms = [m for m in (1, 2, 4, 8, 16, 32) if budget.batch % m == 0]
    for k in divisors(budget.ranks):
        if not 2 <= k <= len(profile.units):
            continue
        for m in ms:
            for schedule in SCHEDULES:
                plan = _pipeline_plan(profile, budget, k, m, schedule, cap)
                if plan is not None:
                    plans.append(plan)
    return plans


def tensor_plans(profile: Profile, budget: Budget) -> list[Plan]:
    """D x T for each T dividing the ranks, no wider than the narrowest split layer: split
    units' compute over T, one all-reduce of each split unit's mean activation in the group
    (Megatron's pairs: one in the forward, one in the backward per pair), the replicas'."""
    split = [u for u in profile.units if u.split_bytes]
    if not split:
        return []
    plans, b = [], budget.batch
    for t in divisors(budget.ranks):
        if not 2 <= t <= min(u.width for u in split):
            continue
        d = budget.ranks // t
        compute = b * sum((u.forward_s + u.backward_s) / (t if u.split_bytes else 1)
                          for u in profile.units)
        group = Job(1, 0.0, 1, budget.ranks, 0, budget.per_node)
        comm = sum(flat_allreduce_s(replace(group, n_params=max(1, b * (u.in_bytes + u.out_bytes) // 8)),
                                    list(range(t)), budget.net) for u in split)
        local = memory.tensor_part(profile, 0, t, 0) // 3
        update = (_replica_allreduce_s(budget, local, t, d) if d > 1 else 0.0) \
            + local * profile.step_s_per_byte
        wire = d * 2 * (t - 1) * sum(b * (u.in_bytes + u.out_bytes) // 2 for u in split) \
            + 2 * (d - 1) * local * t
        plans.append(Plan("tensor", "allreduce", budget.ranks, b, compute + comm + update,
                          memory.tensor_part(profile, b, t, budget.slots), wire, replicas=d,
                          parts=t))
    return plans


def search(profile: Profile, budget: Budget) -> tuple[list[Plan], Plan]:
    """(plans that fit, fastest first; the plan needing the least memory, fit or not).

    Raises UsageError in one line when no plan fits, naming what the smallest needs."""
    if budget.ranks < 1:
        raise UsageError(f"--ranks {budget.ranks}: a plan needs at least 1 rank")
    loose = data_plans(profile, budget) + tensor_plans(profile, budget) \
        + pipeline_plans(profile, budget, None)
    smallest = min(loose, key=lambda p: p.memory)
    fit = [p for p in loose if p.memory <= budget.memory]
    fit += [p for p in pipeline_plans(profile, budget, budget.memory)
            if p.memory <= budget.memory and p not in fit]
    if not fit:
        raise UsageError(f"no plan on {budget.ranks} ranks fits --memory-per-rank "
                         f"{budget.memory} bytes: the smallest ({smallest.label()}) needs "
                         f"{smallest.memory} bytes per rank; give more memory or more ranks")
    fit.sort(key=lambda p: -p.samples_per_s)
    return fit, smallest
