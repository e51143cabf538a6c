"""The search behind `psgd plan --auto`: data-parallel rows of every protocol (plain and
compressed), pipelines D x K (cut by dynamic program), D x K x T (tensor-split stages) and
D x K x P (stages split by rows),
tensor splits D x T, spatial splits D x P and auto grids D x T (each layer's split as --grid
auto chooses it), those over the memory cap dropped, fastest first."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from psgd.errors import UsageError
from psgd.pipeline.schedules import ASYNCHRONOUS, SCHEDULES
from psgd.plan import memory
from psgd.plan.codec import residual
from psgd.plan.cost import NONE, Compression, Job, Network, groups_allreduce_s, predict
from psgd.plan.crowd import slow_down
from psgd.pipeline.partition import min_max_cut
from psgd.plan.cut import Stages, schedule_time, stage_in_flight
from psgd.plan.profile import Profile
from psgd.plan.tensor_comm import tensor_collectives
from psgd.plan.tensor_time import ratio_at, spatial_share, tensor_share


@dataclass(frozen=True)
class Budget:
    """What the search may use: ranks, bytes per rank, the network, the batch per replica;
    ``data_bytes``: the training split, of which each replica's ranks hold 1/D; ``cliques``
    K: rank r on node r mod K (``psgd net``), else ``per_node`` consecutive ranks a node;
    ``cores``: the cores all ranks share (None: a core each)."""

    ranks: int
    memory: int
    net: Network
    per_node: int = 1
    batch: int = 64
    optimizer: str = "sgd"
    data_bytes: int = 0
    cliques: int | None = None
    cores: int | None = None

    @property
    def per_core(self) -> float:
        """Ranks a core runs (1 with a core each)."""
        return max(1.0, self.ranks / self.cores) if self.cores else 1.0

    def slow(self, profile: Profile, key: str = "serial") -> float:
        """Seconds of ``profile``'s step ``key`` (``serial``, ``tensor T``, ``spatial P``) on
        these ranks' cores over its seconds alone (:func:`psgd.plan.crowd.slow_down`)."""
        return slow_down(profile.crowd_ratios, key, self.per_core)

    def crowded(self) -> "Budget":
        """This budget with copies within a node at the share of a core each rank gets (itself
        with a core each)."""
        if self.per_core <= 1:
            return self
        return replace(self, net=replace(self.net, shm_bandwidth=self.net.shm_bandwidth / self.per_core))

    @property
    def slots(self) -> int:
        return memory.OPTIMIZER_SLOTS[self.optimizer]

    def fixed(self, profile: Profile, replicas: int) -> int:
        """A rank's bytes besides its training state: the process's base and its data slice."""
        return profile.base_bytes + -(-self.data_bytes // replicas)


@dataclass(frozen=True)
class Plan:
    """One way to run: ``kind`` data, pipeline, tensor, spatial or grid (--grid D,auto); D = ``replicas`` (the
    workers of a data plan), K ``stages``, T (or P) ``parts`` (a pipeline's split by ``axis``:
    "" --tensor, ``spatial`` --spatial); predicted seconds per step, bytes per rank, idle
    fraction of the pipeline, bytes on the wire per step; ``sync``: the arithmetic is
    serial SGD's on the union of the batches, else ``staleness`` steps expected,
    ``compress``: the pushes go through that lossy compressor, or ``averaging``: each
    worker keeps its own model and averages with its neighbours (gossip, adpsgd)."""

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
    axis: str = ""                 # a pipeline's parts: "" --tensor, "spatial" --spatial
    bubble: float = 0.0
    sync: bool = True
    staleness: float = 0.0
    compress: str = ""
    averaging: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def samples_per_s(self) -> float:
        return self.replicas * self.batch / self.step_s

    def train_args(self) -> list[str]:
        """The ``psgd train`` flags that run this plan (model and data not included)."""
        args = ["--protocol", self.protocol, "--batch-size", str(self.batch)]
        if self.servers:
            args += ["--servers", str(self.servers)]
        if self.compress:
            args += ["--compress", self.compress]
        if self.kind == "pipeline":
            args += ["--pipeline", str(self.stages), "--microbatches", str(self.microbatches),
                     "--schedule", self.schedule, "--partition", ",".join(map(str, self.partition))]
            if self.parts > 1:
                args += ["--spatial" if self.axis == "spatial" else "--tensor", str(self.parts)]
        if self.kind in ("tensor", "spatial"):
            args += ["--grid", f"{self.replicas},{self.parts}"]
        if self.kind == "spatial":
            args += ["--spatial", str(self.parts)]
        if self.kind == "grid":
            args += ["--grid", f"{self.replicas},auto", *self.extra["network"]]
        return args

    def label(self) -> str:
        if self.kind == "pipeline":
            parts = (f"x{self.parts}" + (" spatial" if self.axis == "spatial" else "")) if self.parts > 1 else ""
            return (f"pipeline {self.replicas}x{self.stages}{parts} {self.schedule} M={self.microbatches} "
                    f"cut {','.join(map(str, self.partition))}")
        if self.kind in ("tensor", "spatial"):
            return f"{self.kind} {self.replicas}x{self.parts}"
        if self.kind == "grid":
            spatial = " spatial" if self.extra.get("head") == "spatial" else ""
            return f"grid {self.replicas}x{self.parts} auto{spatial} cut {self.extra['cut']}"
        codec = f" {self.compress}" if self.compress else ""
        return f"{self.extra.get('row', self.protocol)}{codec} W={self.replicas} S={self.servers}"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _server_counts(ranks: int) -> list[int]:
    return sorted({s for s in (1, ranks // 4, ranks // 2) if 1 <= s < ranks})


def _data_memory(profile: Profile, budget: Budget, servers: int, w: int, codec: str) -> int:
    """A data-parallel rank's bytes: the worker's (or the busiest server's) state, a compressed
    push's two frames and its error-feedback residual, the base and the data slice."""
    if servers:
        mem = max(memory.ps_worker(profile, budget.batch),
                  memory.ps_server(profile, servers, w, budget.slots, 0))
    else:
        mem = memory.allreduce_worker(profile, budget.batch, budget.slots)
    if codec:
        mem += 2 * int(profile.param_bytes / profile.codecs[codec][0]) \
            + profile.param_bytes * residual(codec)
    return mem + budget.fixed(profile, w)


def _codec(profile: Profile, budget: Budget, codec: str) -> Compression:
    """The profile's measured ``codec`` (NONE for ""), its encode and decode slowed as the
    compute is when the ranks outnumber the cores."""
    if not codec:
        return NONE
    ratio, encode_s, decode_s, ring = profile.codecs[codec]
    return Compression(ratio, encode_s * budget.per_core, decode_s * budget.per_core, ring)


def _averaging(entry, sync: bool) -> str:
    """How a decentralized protocol's arithmetic departs from serial SGD's ("" for others)."""
    if not entry.decentralized:
        return ""
    return "gossip averaging" if sync else "async gossip averaging"


def data_plans(profile: Profile, budget: Budget) -> list[Plan]:
    """Every protocol's rows (psgd plan's cost model) at S = 0 and a few server counts, plain
    and under each compressor the profile measured (for the protocols that compress)."""
    from psgd.protocols import get
    n_params, p = profile.param_bytes // 4, profile.param_bytes
    plans = []
    for servers in [0] + _server_counts(budget.ranks):
        w = budget.ranks - servers
        for codec in ["", *profile.codecs]:
            c = _codec(profile, budget, codec)
            crowd = budget.slow(profile) / budget.per_core      # beyond Job's ranks / cores
            job = Job(n_params, crowd * profile.compute_at(budget.batch) / budget.batch, budget.batch, w,
                      servers, budget.per_node, budget.cliques, budget.cores, compression=c,
                      optimizer_s=crowd * p * profile.step_s_per_byte)
            for row, r in predict(job, budget.net).items():
                entry = get(row.split()[0])
                if bool(entry.servers) != bool(servers) or codec and not entry.can("compress"):
                    continue
                push = p / c.ratio
                wire = 2 * (w - 1) * push if r["sync"] and not servers else w * (push + p)
                stale = 0.0 if r["sync"] else float(
                    min(w - 1, entry.bound if entry.bound is not None else w - 1))
                plans.append(Plan("data", entry.name, budget.ranks, budget.batch, r["step_s"],
                                  _data_memory(profile, budget, servers, w, codec), wire,
                                  replicas=w, servers=servers,
                                  sync=r["sync"] and not codec and not entry.decentralized,
                                  staleness=stale, compress=codec, extra={"row": row},
                                  averaging=_averaging(entry, r["sync"])))
    return plans


def _link_s_per_byte(budget: Budget, group: int) -> float:
    """A group of ``group`` consecutive ranks talks over shared memory when one node holds it."""
    one_node = budget.cliques == 1 if budget.cliques else budget.per_node >= group
    bw = budget.net.shm_bandwidth if one_node else budget.net.bandwidth
    return 1.0 / bw


def _replica_allreduce_s(budget: Budget, nbytes: float, stride: int, replicas: int) -> float:
    """The all-reduce of ``nbytes`` across the ``replicas`` of each of ``stride`` parts (or
    stages), all at once: rank r is part r % stride of replica r // stride."""
    job = Job(max(1, int(nbytes // 4)), 0.0, 1, budget.ranks, 0, budget.per_node, budget.cliques)
    return groups_allreduce_s(job, _groups(stride, replicas, across=True), budget.net)


def _groups(parts: int, replicas: int, across: bool = False) -> list[list[int]]:
    """The ranks of each replica's ``parts`` (``across``: of each part's ``replicas``) on a
    grid where rank r is part r % parts of replica r // parts."""
    if across:
        return [[s + r * parts for r in range(replicas)] for s in range(parts)]
    return [[g * parts + r for r in range(parts)] for g in range(replicas)]


def _pipeline_plan(profile: Profile, budget: Budget, k: int, m: int, schedule: str,
                   cap: int | None) -> Plan | None:
    d, asynchronous = budget.ranks // k, schedule in ASYNCHRONOUS
    flight = stage_in_flight(schedule, k, m)
    st = Stages(profile, budget.batch // m, _link_s_per_byte(budget, k), budget.net.latency,
                rerun=max(flight) > 1)

    def mem(i, j, s):
        return budget.fixed(profile, d) + st.memory(i, j, flight[s], budget.slots, schedule, d > 1)

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


def pipeline_tensor_plans(profile: Profile, budget: Budget, cap: int | None) -> list[Plan]:
    """D x K x T: pipelines of tensor-split stages (:mod:`psgd.plan.pipeline_tensor`)."""
    from psgd.plan.pipeline_tensor import rows
    return [Plan("pipeline", "allreduce", budget.ranks, budget.batch, **row)
            for row in rows(profile, budget, cap)]


def pipeline_spatial_plans(profile: Profile, budget: Budget, cap: int | None,
                           memo: dict | None = None) -> list[Plan]:
    """D x K x P: pipelines of stages split by rows (:mod:`psgd.plan.pipeline_spatial`;
    ``memo``: its splits and prices, kept between calls on the same profile and budget)."""
    from psgd.plan.pipeline_spatial import rows
    return [Plan("pipeline", "allreduce", budget.ranks, budget.batch, **row)
            for row in rows(profile, budget, cap, memo)]


def tensor_plans(profile: Profile, budget: Budget) -> list[Plan]:
    """D x T for each T dividing the ranks, no wider than the narrowest split layer: split
    units' compute over T (times the profile's ratio measured at T, or the widest timed below it), the group's
    collectives as the split pairs the layers (:func:`psgd.plan.tensor_comm.tensor_collectives`),
    then the replicas' all-reduce."""
    split = [u for u in profile.units if u.split_bytes]
    if not split:
        return []
    plans, b = [], budget.batch
    # each collective as the bytes an all-reduce of the same cost moves (a gather: half)
    reduced = [n if kind == "all-reduce" else n // 2 for kind, n in tensor_collectives(profile.units)]
    for t in divisors(budget.ranks):
        if not 2 <= t <= min(u.width for u in split):
            continue
        d = budget.ranks // t
        compute = ratio_at(profile.tensor_ratios, t, profile.tensor_ratio) * tensor_share(profile.units, b, t) \
            * budget.slow(profile, f"tensor {t}")
        group = Job(1, 0.0, 1, budget.ranks, 0, budget.per_node, budget.cliques)
        comm = sum(groups_allreduce_s(replace(group, n_params=max(1, b * n // 4)), _groups(t, d),
                                      budget.net) for n in reduced)
        local = memory.tensor_params(profile, t)
        update = (_replica_allreduce_s(budget, local, t, d) if d > 1 else 0.0) \
            + local * profile.step_s_per_byte
        wire = d * 2 * (t - 1) * sum(b * n for n in reduced) \
            + 2 * (d - 1) * local * t
        plans.append(Plan("tensor", "allreduce", budget.ranks, b, compute + comm + update,
                          budget.fixed(profile, d) + memory.tensor_part(profile, b, t, budget.slots, d > 1),
                          wire, replicas=d, parts=t))
    return plans


def spatial_plans(profile: Profile, budget: Budget) -> list[Plan]:
    """D x P for each P dividing the ranks that the conv layers take (``--spatial``): the
    leading image units' compute and activations over P, the rest whole on every part, the
    compute times the profile's ratio measured at P (or the widest timed below it); the
    collectives the split layers run (:func:`_spatial_collectives`), then the replicas'
    all-reduce."""
    n, plans, b = profile.spatial_units, [], budget.batch
    lead = profile.units[:n]
    for p in divisors(budget.ranks):
        if not 2 <= p <= profile.spatial_max or n == 0:
            continue
        d = budget.ranks // p
        compute = ratio_at(profile.spatial_ratios, p) * spatial_share(profile.units, n, b, p) \
            * budget.slow(profile, f"spatial {p}")
        comm, moved = _spatial_collectives(profile, budget, p)
        update = (_replica_allreduce_s(budget, profile.param_bytes, p, d) if d > 1 else 0.0) \
            + profile.param_bytes * profile.step_s_per_byte
        acts = b * lead[0].in_bytes + sum((b * u.out_bytes + u.scratch_at(b)) // (p if i < n else 1)
                                          for i, u in enumerate(profile.units))
        mem = (3 + budget.slots) * profile.param_bytes + acts + budget.fixed(profile, d)
        wire = d * 2 * (p - 1) * moved + 2 * (d - 1) * profile.param_bytes * p
        plans.append(Plan("spatial", "allreduce", budget.ranks, b, compute + comm + update, mem,
                          wire, replicas=d, parts=p))
    return plans


def _spatial_collectives(profile: Profile, budget: Budget, p: int) -> tuple[float, float]:
    """(seconds, bytes per rank) of the collectives one step of ``--spatial p`` runs in each
    group, every group at once: each split layer's halo exchange (and its adjoint) and partial
    weight-gradient all-reduce, the batch norms' statistics, the all-gather of the rows
    before the whole layers, as the split layers list them (:func:`psgd.tensor.mixed.step_seconds`,
    priced as ``--grid auto`` prices its spatial heads)."""
    from psgd.plan.grid import ITEMSIZE, group_price, serial_layers, wire_share
    from psgd.plan.tensor_time import Alone
    from psgd.tensor.mixed import step_seconds
    from psgd.tensor.spatial import split_spatial
    split = split_spatial(serial_layers(profile.spec, profile.input_shape, profile.n_classes), Alone(p))
    price = group_price(budget.net, budget.per_node, budget.cliques, budget.ranks, p)
    return (step_seconds(split, budget.batch, ITEMSIZE, price),
            step_seconds(split, budget.batch, ITEMSIZE, wire_share))


def grid_plans(profile: Profile, budget: Budget, crowded: Budget | None = None) -> list[Plan]:
    """--grid D,auto for each T >= 2 dividing the ranks (:func:`psgd.plan.grid.grid_rows`):
    each split chosen on ``budget``'s network, as the run chooses it, and priced on
    ``crowded``'s (default the same)."""
    from psgd.plan.grid import grid_rows, serial_layers
    layers = serial_layers(profile.spec, profile.input_shape, profile.n_classes)
    return [Plan("grid", "allreduce", budget.ranks, budget.batch, **row)
            for row in grid_rows(profile, budget, layers, crowded)]


def _on_shared_cores(profile: Profile, slow: float) -> Profile:
    """``profile`` with its compute and optimizer step ``slow`` times slower."""
    units = tuple(replace(u, forward_s=u.forward_s * slow, backward_s=u.backward_s * slow,
                          forward_fixed_s=u.forward_fixed_s * slow,
                          backward_fixed_s=u.backward_fixed_s * slow) for u in profile.units)
    return replace(profile, units=units, step_s_per_byte=profile.step_s_per_byte * slow)


def search(profile: Profile, budget: Budget) -> tuple[list[Plan], Plan]:
    """(plans that fit, fastest first; the plan needing the least memory, fit or not).

    Where the ranks outnumber the cores (``budget.cores``), each row's compute is slowed by
    :meth:`Budget.slow` for its step and copies within a node by the ranks a core runs.
    Raises UsageError in one line when no plan fits, naming what the smallest needs."""
    if budget.ranks < 1:
        raise UsageError(f"--ranks {budget.ranks}: a plan needs at least 1 rank")
    crowded = budget.crowded()
    # the split rows' step counts its own slow-down: only the optimizer's share here
    shared = replace(profile, step_s_per_byte=profile.step_s_per_byte * budget.per_core)
    pipelined = _on_shared_cores(profile, budget.slow(profile))
    memo: dict = {}         # the D x K x P rows' splits and prices, for both their calls
    loose = data_plans(profile, crowded) + tensor_plans(shared, crowded) \
        + spatial_plans(shared, crowded) + grid_plans(shared, budget, crowded) \
        + pipeline_plans(pipelined, crowded, None) + pipeline_tensor_plans(shared, crowded, None) \
        + pipeline_spatial_plans(shared, crowded, None, memo)
    smallest = min(loose, key=lambda p: p.memory)
    fit = [p for p in loose if p.memory <= budget.memory]
    fit += [p for p in pipeline_plans(pipelined, crowded, budget.memory)
            if p.memory <= budget.memory and p not in fit]
    fit += [p for p in pipeline_tensor_plans(shared, crowded, budget.memory)
            if p.memory <= budget.memory and p not in fit]
    fit += [p for p in pipeline_spatial_plans(shared, crowded, budget.memory, memo)
            if p.memory <= budget.memory and p not in fit]
    if not fit:
        raise UsageError(f"no plan on {budget.ranks} ranks fits --memory-per-rank "
                         f"{budget.memory} bytes: the smallest ({smallest.label()}) needs "
                         f"{smallest.memory} bytes per rank; give more memory or more ranks")
    fit.sort(key=lambda p: -p.samples_per_s)
    return fit, smallest
