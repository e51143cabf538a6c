"""Bytes one rank holds under a plan: parameters, gradients, optimizer state, stashed weights,
activations at the schedule's peak, and the all-reduce, push and compensation buffers."""
from __future__ import annotations

from psgd.plan.profile import Profile, Unit

# float32 slots per parameter that each optimizer keeps (psgd.nn.optim)
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "nesterov": 1, "adagrad": 1, "adam": 2}


def activations(units: tuple[Unit, ...] | list[Unit], samples: int, parts: int = 1) -> int:
    """One forward's stored activations for ``samples``: the input and every unit's output,
    and the layers' scratch (:meth:`Unit.scratch_at`); a unit whose parameters --tensor
    splits keeps 1/``parts`` of its output and scratch."""
    return samples * units[0].in_bytes + sum(
        (samples * u.out_bytes + u.scratch_at(samples)) // (parts if u.split_bytes else 1)
        for u in units)


def allreduce_worker(profile: Profile, batch: int, slots: int) -> int:
    """A worker of the all-reduce: parameters, gradient, optimizer state, the all-reduce's
    receive buffer, and the batch's activations."""
    return (3 + slots) * profile.param_bytes + activations(profile.units, batch)


def ps_worker(profile: Profile, batch: int) -> int:
    """A parameter-server worker: parameters, gradient, the push buffer, the activations (the
    servers hold the optimizer state)."""
    return 3 * profile.param_bytes + activations(profile.units, batch)


def ps_server(profile: Profile, servers: int, workers: int, slots: int, copies: int) -> int:
    """A server's shard: parameters, the summed push, optimizer state, and ``copies`` per
    worker of compensation buffers (a DC-ASGD backup of the parameters each worker read)."""
    shard = -(-profile.param_bytes // servers)
    return (2 + slots + copies * workers) * shard


def pipeline_stage(units: list[Unit], microbatch: int, in_flight: int, slots: int,
                   stashed: int = 0, replicated: bool = False) -> int:
    """A pipeline stage: parameters, gradient and its accumulation, optimizer state,
    ``stashed`` weight versions (PipeDream), the all-reduce buffer across replicas, the
    inputs of ``in_flight`` microbatches and one microbatch's activations and scratch inside it."""
    params = sum(u.param_bytes for u in units)
    return ((3 + slots + stashed + int(replicated)) * params
            + in_flight * microbatch * units[0].in_bytes
            + sum(microbatch * u.out_bytes + u.scratch_at(microbatch) for u in units))


def tensor_params(profile: Profile, parts: int) -> int:
    """The parameter bytes one of ``parts`` tensor ranks holds: split ones divided, others whole."""
    split = sum(u.split_bytes for u in profile.units)
    return profile.param_bytes - split + -(-split // parts)


def tensor_part(profile: Profile, batch: int, parts: int, slots: int, replicated: bool) -> int:
    """One of ``parts`` tensor ranks: its parameters, their gradient, optimizer state, the
    all-reduce buffer across ``replicated`` replicas, and the activations (split units' 1/T)."""
    params = tensor_params(profile, parts)
    return (2 + slots + int(replicated)) * params + activations(profile.units, batch, parts)


def grid_params(profile: Profile, on_samples: int, parts: int) -> int:
    """The parameter bytes one of ``parts`` ranks of a --grid auto group holds: the first
    ``on_samples`` units' whole, the rest's as a tensor part's."""
    split = sum(u.split_bytes for u in profile.units[on_samples:])
    return profile.param_bytes - split + -(-split // parts)


def grid_part(profile: Profile, batch: int, parts: int, slots: int, replicated: bool,
              on_samples: int, spatial: bool = False) -> int:
    """One of ``parts`` ranks of a --grid auto group: its parameters (:func:`grid_params`),
    their gradient, optimizer state, the all-reduce buffer across ``replicated`` replicas, the
    batch's input, the first ``on_samples`` units' activations at its share of the samples
    (``spatial``: every sample's 1/parts of the rows), and the rest's as a tensor part's from
    the gathered batch."""
    params = grid_params(profile, on_samples, parts)
    head, tail = profile.units[:on_samples], profile.units[on_samples:]
    share = -(-batch // parts)
    if spatial:
        acts = batch * head[0].in_bytes + sum(-(-(batch * u.out_bytes + u.scratch_at(batch)) // parts)
                                              for u in head)
    else:
        acts = batch * head[0].in_bytes + sum(share * u.out_bytes + u.scratch_at(share) for u in head) \
            if head else 0
    return (2 + slots + int(replicated)) * params + acts + (activations(tail, batch, parts) if tail else 0)
