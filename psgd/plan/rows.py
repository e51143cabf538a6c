"""Each protocol's rows in `psgd plan`: a registry entry's ``cost`` names one of these, and it
returns {row name: (seconds per worker step, synchronous?)} from the cost model's phases."""
from __future__ import annotations

from dataclasses import replace

from psgd.plan.cost import (HIDDEN_EXCHANGE, NONE, STEP_PASSES, Job, Network, Traffic, async_rate,
                            bsp_step_s, hierarchical_step_s, ring_step_s)


def bsp_rows(job: Job, net: Network, name: str) -> dict[str, tuple[float, bool]]:
    """The bsp row: its clock (:func:`bsp_step_s`), synchronous."""
    return {name: (bsp_step_s(job, net), True)}


def async_rows(job: Job, net: Network, name: str) -> dict[str, tuple[float, bool]]:
    """An ssp or asp row: a worker step at :func:`async_rate` (the bound is not modelled)."""
    return {name: (job.workers / async_rate(job, net), False)}


def hogwild_rows(job: Job, net: Network, name: str) -> dict[str, tuple[float, bool]]:
    """The hogwild row: one-sided accumulates, never compressed; a sparse model's update and
    read move index + value of the touched coordinates."""
    plain = replace(job, compression=NONE)
    rate = async_rate(plain, net, job.update_bytes, job.update_bytes, job.update_bytes)
    return {name: (job.workers / rate, False)}


def allreduce_rows(job: Job, net: Network, name: str) -> dict[str, tuple[float, bool]]:
    """The all-reduce rows: the flat ring and the hierarchical one, or under compression the
    one flat schedule psgd compresses through (ring or gather)."""
    if job.compression == NONE:
        return {f"{name} ring": (ring_step_s(job, net), True),
                f"{name} hierarchical": (hierarchical_step_s(job, net), True)}
    return {f"{name} {'ring' if job.compression.ring else 'gather'}": (ring_step_s(job, net), True)}


def gossip_rows(job: Job, net: Network, name: str) -> dict[str, tuple[float, bool]]:
    """The D-PSGD row on the default topology: each worker sends its model to each neighbour,
    then mixes d + 1 models and steps. Between nodes :data:`HIDDEN_EXCHANGE` of the exchange
    moves during the next gradient's compute (at most the compute), the rest after it; with
    a neighbour on its own node it all moves after the compute (both ends must poll), as
    :func:`psgd.simulate.gossip.step_ends` has it."""
    from psgd.gossip.topology import DEFAULT, neighbours
    near = neighbours(DEFAULT, job.workers)
    t = Traffic(job)
    for i, js in enumerate(near):
        for j in js:
            t.carry(i, j, job.nbytes)
    degree = max(map(len, near))
    mix_s = (degree + 1 + STEP_PASSES) * job.nbytes / net.shm_bandwidth
    exchange = t.seconds(net, degree)
    local = any(job.node(i) == job.node(j) for i, js in enumerate(near) for j in js)
    hidden = 0.0 if local else min(HIDDEN_EXCHANGE * exchange, job.compute_step_s)
    return {name: (job.compute_step_s + exchange - hidden + mix_s, True)}


def adpsgd_rows(job: Job, net: Network, name: str) -> dict[str, tuple[float, bool]]:
    """The AD-PSGD row: after each gradient a worker swaps models with one neighbour (all pairs
    of the ring at once, the busiest case), averages the two and steps; no global step."""
    t = Traffic(job)
    for i in range(0, job.workers - 1, 2):
        t.carry(i, i + 1, job.nbytes)
        t.carry(i + 1, i, job.nbytes)
    exchange_s = t.seconds(net, 2) if job.workers > 1 else 0.0
    return {name: (job.compute_step_s + exchange_s
                   + (2 + STEP_PASSES) * job.nbytes / net.shm_bandwidth, False)}
