"""Pipeline stages split by --tensor (ranks = D x K x T): each stage's layers split over its T
parts as a whole --tensor model's are, a stage's input and output whole on every part.

Each part of stage s receives the whole activation from the same part of stage s - 1 and
sends its whole input gradient back (every part holds the same values), so a stage
boundary costs T parallel messages of one activation each and no collective.
"""
from __future__ import annotations

import numpy as np

from psgd.nn.model import _walk
from psgd.nn.norm import BatchNorm
from psgd.pipeline.trainer import PipelineTrainer, slots
from psgd.tensor.conv import split_tensor
from psgd.tensor.model import TensorModel

SCHEDULES = ("gpipe", "1f1b")


def parts_of(settings) -> int:
    """T of a pipeline run: --tensor T, or the T of --grid D,T (1: stages run whole)."""
    split = settings.split
    if split.tensor:
        return int(split.tensor)
    if split.grid and "," in str(split.grid) and "auto" not in str(split.grid):
        return int(str(split.grid).split(",")[1])
    return 1


def refused(given: dict, schedule: str, servers: bool) -> str | None:
    """The line refusing a split that tensor-split stages do not run (None: they run it)."""
    if given.get("spatial"):
        return ("--spatial does not work under --pipeline: a stage's parts exchange halos "
                "inside the stage only, and stages split by rows are not built; use --tensor T")
    grid = str(given.get("grid") or "")
    if grid and ("," not in grid or "auto" in grid):
        return (f"--grid {grid} does not work under --pipeline: each stage splits its layers by "
                f"--tensor T (or --grid D,T); a per-layer choice across stages is not built")
    if schedule not in SCHEDULES:
        return (f"--schedule {schedule} does not work with tensor-split stages: it steps after "
                f"every microbatch, and split stages run {' or '.join(SCHEDULES)} (one step "
                f"per batch, after the flush)")
    if servers:
        return ("--pipeline with --tensor combines the replicas of each (stage, part) by "
                "--protocol allreduce or bsp without servers; server shards of split stages "
                "are not built")
    for name in ("checkpoint_dir", "resume"):
        if given.get(name):
            return (f"--{name.replace('_', '-')} does not work with tensor-split stages yet: "
                    f"each part's slice of a stage is not written as a checkpoint part")
    if given.get("recompute") == "off":
        return ("--recompute off does not work with tensor-split stages: the activation store "
                "does not reach inside the split conv layers, so each backward re-runs its "
                "forward (--recompute on)")
    return None


def check_grid(settings, stages: int, size: int) -> None:
    """ValueError where --grid D,T does not multiply with K to the ranks."""
    grid = settings.split.grid
    if grid and settings.split.tensor is None:
        d = int(str(grid).split(",")[0])
        t = parts_of(settings)
        if d * stages * t != size:
            raise ValueError(f"--grid {grid} with --pipeline {stages}: {d} x {stages} x {t} = "
                             f"{d * stages * t} ranks, but the job has {size}")


def stage_model(settings, info: dict, a: int, b: int, comm) -> TensorModel:
    """Stage ``[a, b)`` of ``--model`` split over ``comm`` (the stage's parts); its layers run
    from index 0 (``model.a``, ``model.b`` span them, as :mod:`psgd.pipeline.evaluate` reads)."""
    model = TensorModel(settings.model, lambda layers, c: split_tensor(layers, c, close=True),
                        comm, seed=settings.seed, dtype=np.dtype(settings.split.dtype),
                        input_shape=info["input_shape"], n_classes=info["n_classes"], span=(a, b))
    if model.partial.size:
        raise AssertionError("a --tensor split left a partial gradient; stages do not reduce it")
    model.a, model.b = 0, len(model.layers)
    model.any_batchnorm = any(isinstance(p, BatchNorm) for p in _walk(model.serial_layers))
    return model


def build_trainer(model: TensorModel, grid, options, make_optimizer, batch_size: int,
                  batches: int, spin_s: float = 0.0) -> PipelineTrainer:
    """This part's trainer: the whole split layer list is its stage, each backward re-runs its
    forward, the links carry whole activations to the same part of the next stage; ``spin_s``
    as :class:`psgd.pipeline.transport.Links` takes it."""
    from psgd.pipeline.stage import Stage
    from psgd.pipeline.transport import Links
    k, s = grid.stages, grid.stage
    stage = Stage(model, 0, len(model.layers), first=s == 0, last=s == k - 1, keep=False)
    micro, total = batch_size // options.microbatches, batches * options.microbatches
    shape_in = (micro, *model.layers[0].in_shape)
    shape_out = (micro, *model.layers[-1].out_shape)
    links = Links(grid.p2p, s, grid.prev, grid.next, shape_in, shape_out, model.dtype,
                  slots(options, k, s, total), slots(options, k, s + 1, total) if s + 1 < k else 0,
                  slots(options, k, s - 1, total) if s > 0 else 0, total, spin_s)
    return PipelineTrainer(stage, links, grid, options, make_optimizer(model.n_params))
