"""Pipeline stages split by --spatial P (ranks = D x K x P): each stage's conv, pool and
batch-norm layers split by image rows over its P parts with halo exchange
(:mod:`psgd.tensor.spatial`), the rest whole on every part.

A stage's input and output are whole on every part, as a tensor-split stage's, so the links,
trainer, evaluation and checkpoints are :mod:`psgd.tensor.pipeline`'s: each part keeps its
rows of the input (the backward all-gathers the input gradient) and all-gathers its output
rows before sending them on.  The conv weights' gradients are partial sums over the parts:
one all-reduce of them before each optimizer step.
"""
from __future__ import annotations

import numpy as np

from psgd.nn.layers import ChannelsLast
from psgd.tensor import primitives as pr
from psgd.tensor.residual import SplitResidual
from psgd.tensor.spatial import SpatialWindow, TooThin, height_split


def _span(layers: list) -> str:
    return f"{type(layers[0]).__name__} .. {type(layers[-1]).__name__}"


def rows_split(span: tuple[int, int]):
    """The split of serial layers ``span`` = [a, b) as one stage of ``--spatial P`` (for
    :class:`psgd.tensor.model.TensorModel`): by rows from the input image on (or from the
    first :class:`ChannelsLast`), gathered where whole images are needed and at the end.
    ValueError (one line) for a stage with no layer split by rows."""
    a, b = span

    def split(layers: list, comm) -> list:
        p, where = comm.Get_size(), f"the stage of layers {a}..{b - 1} ({_span(layers)})"
        image = len(layers[0].in_shape) == 3 and not isinstance(layers[0], ChannelsLast)
        if not image and not any(isinstance(q, ChannelsLast) for q in layers):
            raise ValueError(f"--spatial {p} under --pipeline: {where} takes no image, so it has no "
                             f"rows to split; cut the model so every stage holds a conv or pool "
                             f"layer (--partition)")
        try:
            out, _ = height_split(layers, comm, begin=image, close=True)
        except TooThin as exc:
            raise ValueError(f"{exc} ({where})") from None
        if not any(isinstance(q, (SpatialWindow, SplitResidual)) for q in out):
            raise ValueError(f"--spatial {p} under --pipeline: {where} has no conv or pool layer "
                             f"to split by rows; cut the model so every stage holds one "
                             f"(--partition)")
        return out
    return split


class ReducedOptimizer:
    """``optimizer`` whose step first sums the partial gradient entries (``partial``: indices
    into the stage's gradient) over ``comm``, the stage's parts: the conv weights' gradient
    is each part's rows' share."""

    def __init__(self, optimizer, partial: np.ndarray, comm) -> None:
        self.optimizer, self.partial, self.comm = optimizer, partial, comm

    def step(self, params, grad, lr, **kwargs):
        grad[self.partial] = pr.allreduce_forward(grad[self.partial], self.comm)
        return self.optimizer.step(params, grad, lr, **kwargs)

    def __getattr__(self, name):
        return getattr(self.optimizer, name)


def reducing(make_optimizer, model, options):
    """``make_optimizer`` whose optimizers reduce ``model``'s partial gradient entries over its
    parts (:class:`ReducedOptimizer`); ValueError under ``--stage-comp``, whose adjusted
    gradient would be of the unreduced one."""
    if getattr(options, "comp", "none") != "none":
        raise ValueError(f"--stage-comp {options.comp} does not work with stages split by "
                         f"--spatial: it would adjust each part's partial gradient")
    return lambda n: ReducedOptimizer(make_optimizer(n), model.partial, model.comm)


class RowsComm:
    """Part ``rank`` of a ``size``-part group, for building (not running) a stage's split:
    the split layers read only the group's size and rank."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size


def splits(layers: list, span: tuple[int, int], parts: int) -> str | None:
    """None if serial layers ``layers`` (= the model's [a, b)) split as a stage over ``parts``,
    else the one-line reason."""
    try:
        rows_split(span)(list(layers), RowsComm(0, parts))
    except ValueError as exc:
        return str(exc)
    return None


def split_cut(model, opts, parts: int, costs: list, in_flight) -> list[int]:
    """``--partition auto`` for stages split by ``--spatial parts``: the min-max cut over the
    unsplit units' ``costs`` (:func:`psgd.pipeline.partition.profile`; the halos, the edge
    all-gather and the 1/P of the conv work are not priced) among the cuts whose every stage
    splits by rows, within ``--memory-per-rank`` by the unsplit stage's bytes (the
    parameters are whole on every part; the activations, counted whole, over-estimated)."""
    from psgd.pipeline.partition import min_max_cut, recompute_shares, stage_memory, stage_time, units
    bounds = units(model)
    if not any(isinstance(q, ChannelsLast) for q in model.layers) and len(model.layers[0].in_shape) != 3:
        raise ValueError(f"--spatial needs a model with conv layers (an image input); "
                         f"{model.spec} has none")
    again = recompute_shares(opts.schedule, opts.stages, opts.microbatches)
    cache: dict = {}

    def fits(i: int, j: int, k: int) -> bool:
        if (i, j) not in cache:
            a, b = bounds[i][0], bounds[j - 1][1]
            cache[i, j] = splits(model.layers[a:b], (a, b), parts) is None
        memory = opts.memory_per_rank
        return cache[i, j] and (memory is None or stage_memory(costs[i:j], in_flight(k)) <= memory)

    counts = min_max_cut(len(costs), opts.stages,
                         lambda i, j, last: stage_time(costs[i:j], 0.0, last, again), fits)
    if counts is None:
        raise ValueError(f"no cut of {model.spec} into {opts.stages} stages gives every stage a "
                         f"conv or pool layer that splits over --spatial {parts}"
                         + (f" within --memory-per-rank {opts.memory_per_rank}"
                            if opts.memory_per_rank else ""))
    return counts
