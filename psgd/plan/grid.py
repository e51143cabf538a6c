"""`--grid auto` in `psgd plan`: the price its cut is chosen by (:func:`group_price`, which
the run's :mod:`psgd.run.grid_cost` uses too) and the D x T rows, each at the cut
:func:`psgd.tensor.mixed.choose_cut` takes, with the profile's compute and memory."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np

from psgd.plan import memory
from psgd.plan.cost import Job, Network, Traffic, groups_allreduce_s
from psgd.plan.profile import macs

ITEMSIZE = 4        # float32, psgd train's dtype
MAC_S = 1e-10       # seconds per multiply-add of the run's compute term (its imbalance only)


def group_price(net: Network, per_node: int, cliques: int | None, ranks: int, parts: int,
                first: int = 0, mac_s: float = MAC_S):
    """``price(kind, nbytes)``: seconds of one collective of ``nbytes`` among the ``parts``
    ranks of a group (kind ``all-reduce`` or ``all-gather``, the latter priced as an
    all-reduce of half its bytes, as the tensor rows price it), or across the replicas (kind
    ``replica all-reduce``), on a grid of ``ranks`` from world rank ``first`` in which rank w
    is part w % parts of replica w // parts: psgd's all-reduce on ``net``, every group (or
    every part's replicas) at once, their bytes sharing the links; ``price.mac_s``:
    the seconds per multiply-add :func:`choose_split` weighs the compute by."""
    job = Job(1, 0.0, 1, first + ranks, 0, per_node, cliques)
    groups = [[first + g + r for r in range(parts)] for g in range(0, ranks, parts)]
    replicas = [[first + s + r for r in range(0, ranks, parts)] for s in range(parts)]

    def price(kind: str, nbytes: float) -> float:
        if kind == "halo":          # each part's rows to its neighbours, at once
            return _halo_s(job, groups, nbytes, net)
        reduced = nbytes / 2 if kind == "all-gather" else nbytes
        return groups_allreduce_s(replace(job, n_params=max(1, int(reduced // 4))),
                                  replicas if kind == "replica all-reduce" else groups, net)
    price.mac_s = mac_s
    return price


def choose_grid(layers: list, world: int, batch: int, itemsize: int, price_of, parts=None,
                broadcast: bool = False) -> tuple:
    """Plain ``--grid auto`` on ``world`` ranks: (D, T, {"DxT": seconds per sample}) of the
    grid whose cheapest split (:func:`choose_split`, priced by ``price_of(D, T)``) costs the
    fewest collective and compute seconds per sample, for each T dividing ``world`` (in
    ``parts`` when given, at most the batch).  Each replica reads its own batch, and every grid
    divides the computation over all the ranks (compute differs only by imbalance); ties go
    to the larger D (fewer split layers); ``broadcast``: as :func:`split_prices`'s."""
    from psgd.plan.tensor_time import Alone
    per_sample = {}
    for t in [t for t in range(world, 0, -1) if world % t == 0 and t <= max(1, batch)]:
        if parts is None or t in parts:
            d = world // t
            head, cut, rows = choose_split(layers, Alone(t), batch, itemsize, price_of(d, t), d,
                                           broadcast=broadcast and t > 1)
            best = next(r for r in rows if (r["head"], r["cut"]) == (head, cut))
            per_sample[f"{d}x{t}"] = (best["collective_s"] + best["compute_s"]) / (d * batch)
    if not per_sample:
        raise ValueError(f"--grid auto: no grid of {world} ranks whose parts divide the servers")
    best = min(per_sample.values())
    d, t = next(k for k, v in reversed(per_sample.items()) if v == best).split("x")
    return int(d), int(t), per_sample


def _halo_s(job: Job, groups: list, nbytes, net: Network) -> float:
    """A halo exchange in every group at once: ``nbytes[q]`` = (the bytes part q sends part
    q + 1, those part q + 1 sends part q); the latency of the most messages a part sends; 0
    where no part sends."""
    sends = np.asarray(nbytes, dtype=float).reshape(-1, 2)
    if not sends.any():
        return 0.0
    t = Traffic(job)
    for group in groups:
        for (a, b), (down, up) in zip(zip(group, group[1:]), sends):
            t.carry(a, b, down)
            t.carry(b, a, up)
    messages = np.zeros(len(sends) + 1, dtype=int)
    messages[:-1] += sends[:, 0] > 0
    messages[1:] += sends[:, 1] > 0
    return t.seconds(net, int(messages.max()))


def wire_share(kind: str, nbytes) -> float:
    """A collective's bytes as the wire column counts them (2 (T - 1) times this per group):
    an all-reduce's, half an all-gather's, a halo's total over 2 (T - 1)."""
    if kind == "halo":
        return float(np.sum(nbytes)) / (2 * len(nbytes))
    return nbytes / 2 if kind == "all-gather" else nbytes


def split_prices(layers: list, comm, batch: int, itemsize: int, price, replicas: int = 1,
                 mac_s: float | None = None, broadcast: bool = False) -> list[dict]:
    """Every head (batch, spatial) and cut of :func:`~psgd.tensor.mixed.split_mixed` that
    splits: its collective seconds (halos included, and the replicas' all-reduce as
    :func:`~psgd.tensor.mixed.choose_cut` prices it), the busiest rank's compute seconds
    (forward and backward, 3x the multiply-adds at ``mac_s``: the head on ceil(B/T) samples,
    or on every sample's largest share of rows; the tail divided by T) and the head's
    activation bytes on that rank. ``mac_s`` None: ``price.mac_s``, else :data:`MAC_S`.
    ``broadcast`` (asp/ssp under servers): each step part 0 broadcasts the head's weights, which
    every part holds a copy of (:func:`psgd.run.tensor_rank.copies`; a row layer's bias, a few
    values, not counted), priced as an all-gather of their bytes."""
    from psgd.tensor.mixed import local_values, split_mixed, step_seconds
    mac_s = mac_s if mac_s is not None else getattr(price, "mac_s", MAC_S)
    from psgd.tensor.primitives import split_sizes
    t, rows = comm.Get_size(), []
    for head, cut in [(h, c) for h in ("batch", "spatial") for c in range(len(layers) + 1)]:
        if head == "batch" and cut and batch < t:
            continue                                # a part with no sample
        try:
            split = split_mixed(layers, comm, cut, head)
        except ValueError:
            continue
        share = [-(-batch // t) / batch if head == "batch" else
                 (max(split_sizes(la.out_shape[0], t)) / la.out_shape[0] if len(la.out_shape) == 3 else 1.0)
                 for la in layers[:cut]]
        compute = 3 * mac_s * batch * (sum(s * macs(la) for s, la in zip(share, layers[:cut]))
                                       + sum(macs(la) for la in layers[cut:]) / t)
        across = price("replica all-reduce", local_values(split) * itemsize) if replicas > 1 else 0.0
        if broadcast and cut:
            across += price("all-gather", itemsize * sum(
                int(np.prod(s)) for la in layers[:cut] for _, s in la.param_shapes()))
        rows.append({"head": head, "cut": cut, "compute_s": compute,
                     "collective_s": step_seconds(split, batch, itemsize, price) + across,
                     "memory": batch * itemsize * sum(s * int(np.prod(la.out_shape)) for s, la in zip(share, layers[:cut]))})
    return rows


def choose_split(layers: list, comm, batch: int, itemsize: int, price, replicas: int = 1,
                 mac_s: float | None = None, broadcast: bool = False) -> tuple[str, int, list]:
    """(head, cut, every row of :func:`split_prices`) of the least collective plus compute
    seconds; ties go to a batch head, then the later cut."""
    rows = split_prices(layers, comm, batch, itemsize, price, replicas, mac_s, broadcast)
    best = min(r["collective_s"] + r["compute_s"] for r in rows)
    pick = max((r for r in rows if r["collective_s"] + r["compute_s"] == best),
               key=lambda r: (r["head"] == "batch", r["cut"]))
    return pick["head"], pick["cut"], rows


def network_args(budget) -> list[str]:
    """The ``psgd train`` flags that give the run ``budget``'s network to cut by (the grid
    rows add ``--mac-ns``)."""
    return ["--bandwidth", f"{budget.net.bandwidth * 8e-9:.12g}gbit",
            "--latency-us", f"{budget.net.latency * 1e6:.12g}", "--per-node", str(budget.per_node)]


def serial_layers(spec: str, input_shape: tuple = (), n_classes: int = 0) -> list | None:
    """The layers of ``spec`` on ``input_shape`` (empty: the spec's own) as the run splits them
    (no parameters drawn); None for a spec without a shape, or sparse (no --grid auto row)."""
    from psgd.nn.model import model_layers
    try:
        return list(model_layers(spec, 0, input_shape or None, n_classes or None)[0])
    except ValueError:
        return None


def grid_rows(profile, budget, layers: list | None, crowded=None) -> list[dict]:
    """The fields of each :class:`~psgd.plan.search.Plan` of kind ``grid`` (all but kind,
    protocol, ranks and batch): ``--grid D,auto`` for each T >= 2 dividing the ranks, no more
    than the batch: the head (batch or spatial) and cut :func:`choose_split` takes on the
    budget's network, as the run takes them (the seconds per multiply-add the command passes
    it: the profile's), its collectives priced on ``crowded``'s network (default the
    budget's); the units before the cut on batch / T samples (a batch head) or every
    sample's rows over T times the profile's spatial ratio at T (a spatial head), those
    after it as a tensor row's (split units over T, times the ``tensor_ratios`` entry for
    T), all slowed as :meth:`~psgd.plan.search.Budget.slow` gives for ``tensor T``; the
    optimizer step on the rank's parameters."""
    from psgd.pipeline.partition import units
    from psgd.plan.tensor_time import Alone
    from psgd.tensor.mixed import split_mixed, step_seconds
    if layers is None or not any(u.split_bytes for u in profile.units):
        return []
    crowded = crowded or budget
    starts = [a for a, _ in units(SimpleNamespace(layers=layers))]
    plans, b, mac_s = [], budget.batch, mac_seconds(profile)
    for t in [t for t in range(2, min(b, budget.ranks) + 1) if budget.ranks % t == 0]:
        d = budget.ranks // t
        price = group_price(budget.net, budget.per_node, budget.cliques, budget.ranks, t, mac_s=mac_s)
        head, cut, rows = choose_split(layers, Alone(t), b, ITEMSIZE, price, d)
        if crowded is not budget:
            price = group_price(crowded.net, budget.per_node, budget.cliques, budget.ranks, t, mac_s=mac_s)
            rows = split_prices(layers, Alone(t), b, ITEMSIZE, price, d)
        collective = next(r for r in rows if (r["head"], r["cut"]) == (head, cut))["collective_s"]
        k = sum(a < cut for a in starts)            # units on samples, or on rows
        compute = budget.slow(profile, f"tensor {t}") * _grid_compute(profile, head, k, b, t)
        local = memory.grid_params(profile, k, t)
        moved = step_seconds(split_mixed(layers, Alone(t), cut, head), b, ITEMSIZE, wire_share)
        wire = d * 2 * (t - 1) * moved + 2 * (d - 1) * local * t
        plans.append({"step_s": compute + collective + local * profile.step_s_per_byte,
                      "memory": budget.fixed(profile, d) + memory.grid_part(
                          profile, b, t, budget.slots, d > 1, k, head == "spatial"),
                      "wire_bytes": wire, "replicas": d, "parts": t,
                      "extra": {"cut": cut, "head": head, "collective_s": collective, "compute_s": compute,
                                "network": network_args(budget) + ["--mac-ns", f"{mac_s * 1e9:.6g}"]}})
    return plans


def mac_seconds(profile) -> float:
    """The profile's seconds per multiply-add, rounded as the command passes it (``--mac-ns``),
    or :data:`MAC_S` for a profile without one."""
    return float(f"{profile.mac_s * 1e9:.6g}") * 1e-9 if profile.mac_s > 0 else MAC_S


def _grid_compute(profile, head: str, k: int, batch: int, t: int) -> float:
    """One rank's compute: the ``k`` head units on its samples or rows, the rest as a tensor
    part's."""
    from psgd.plan.tensor_time import ratio_at, spatial_share
    first, tail = profile.units[:k], profile.units[k:]
    if head == "spatial":
        lead = spatial_share(first, k, batch, t) * ratio_at(profile.spatial_ratios, t)
    else:
        lead = sum(u.forward_at(-(-batch // t)) + u.backward_at(-(-batch // t)) for u in first)
    ratio = ratio_at(profile.tensor_ratios, t, profile.tensor_ratio)
    return lead + ratio * sum((u.forward_at(batch) + u.backward_at(batch)) / (t if u.split_bytes else 1)
                              for u in tail)
