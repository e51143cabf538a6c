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
from psgd.tensor.spatial_stages import reducing, rows_split

SCHEDULES = ("gpipe", "1f1b", "pipedream", "pipemare")


def parts_of(settings) -> int:
    """T of a pipeline run: --tensor T, --spatial P, or the T of --grid D,T (1: stages run whole)."""
    split = settings.split
    if split.tensor or getattr(split, "spatial", None):
        return int(split.tensor or split.spatial)
    if split.grid and "," in str(split.grid) and "auto" not in str(split.grid):
        return int(str(split.grid).split(",")[1])
    return 1


def refused(given: dict, schedule: str) -> str | None:
    """The line refusing a split that tensor-split stages do not run (None: they run it)."""
    grid = str(given.get("grid") or "")
    if grid and ("," not in grid or "auto" in grid):
        return (f"--grid {grid} does not work under --pipeline: each stage splits its layers by "
                f"--tensor T (or --grid D,T); a per-layer choice across stages is not built")
    if given.get("spatial") and given.get("recompute") == "off":
        return ("--recompute off does not work with stages split by rows: their activation "
                "store is not built (--recompute on)")
    if schedule not in SCHEDULES:
        return (f"--schedule {schedule} does not work with tensor-split stages: they run "
                f"{', '.join(SCHEDULES)}")
    return None


def check_ranks(settings, stages: int, size: int, n_servers: int) -> None:
    """ValueError where the ranks less ``n_servers`` are not D x K x T (or --grid D,T's)."""
    check_grid(settings, stages, size)
    parts = parts_of(settings)
    if (size - n_servers) % (stages * parts):
        axis = "--spatial" if settings.split.spatial else "--tensor"
        raise ValueError(f"--pipeline {stages} {axis} {parts}: the {size} ranks are not D "
                         f"replicas x {stages} stages x {parts} parts (give a multiple of "
                         f"{stages * parts} ranks)")


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
    """Stage ``[a, b)`` of ``--model`` split over ``comm`` (the stage's parts; by rows under
    ``--spatial``, :mod:`psgd.tensor.spatial_stages`); its layers run from index 0
    (``model.a``, ``model.b`` span them, as :mod:`psgd.pipeline.evaluate` reads)."""
    spatial = getattr(settings.split, "spatial", None)
    split = rows_split((a, b)) if spatial else lambda layers, c: split_tensor(layers, c, close=True)
    model = TensorModel(settings.model, split, comm, seed=settings.seed, dtype=np.dtype(settings.split.dtype),
                        input_shape=info["input_shape"], n_classes=info["n_classes"], span=(a, b))
    if model.partial.size and not spatial:
        raise AssertionError("a --tensor split left a partial gradient; stages do not reduce it")
    model.a, model.b = 0, len(model.layers)
    model.any_batchnorm = any(isinstance(p, BatchNorm) for p in _walk(model.serial_layers))
    return model


def build_trainer(model: TensorModel, grid, options, make_optimizer, batch_size: int,
                  batches: int, spin_s: float = 0.0, whole: int | None = None) -> PipelineTrainer:
    """This part's trainer: the whole split layer list is its stage (``--recompute off``: the
    activation store keeps each in-flight microbatch's layer state), the links carry whole
    activations to the same part of the next stage; ``spin_s`` as
    :class:`psgd.pipeline.transport.Links` takes it.  Under pipedream and pipemare the
    unsplit pipeline's :func:`psgd.pipeline.trainer.build_trainer` builds it on the split
    layers (``whole``: the run's steps, as it takes them)."""
    from psgd.pipeline.schedules import ASYNCHRONOUS
    from psgd.pipeline.stage import Stage
    if model.partial.size:   # --spatial: the conv weights' gradients are partial sums
        make_optimizer = reducing(make_optimizer, model, options)
    if options.schedule in ASYNCHRONOUS:
        from psgd.pipeline.trainer import build_trainer as build_stage
        return build_stage(model, grid, options, [(0, len(model.layers))] * grid.stages,
                           make_optimizer, batch_size, batches, whole=whole, spin_s=spin_s)
    from psgd.pipeline.transport import Links
    k, s = grid.stages, grid.stage
    stage = Stage(model, 0, len(model.layers), first=s == 0, last=s == k - 1,
                  keep=not options.recomputes)
    micro, total = batch_size // options.microbatches, batches * options.microbatches
    shape_in = (micro, *model.layers[0].in_shape)
    shape_out = (micro, *model.layers[-1].out_shape)
    links = Links(grid.p2p, s, grid.prev, grid.next, shape_in, shape_out, model.dtype,
                  slots(options, k, s, total), slots(options, k, s + 1, total) if s + 1 < k else 0,
                  slots(options, k, s - 1, total) if s > 0 else 0, total, spin_s)
    optimizer = make_optimizer(model.n_params) if make_optimizer is not None else None
    return PipelineTrainer(stage, links, grid, options, optimizer)   # None: the servers step


# -- the cut of a split pipeline: unit costs and memory of the split layers -------------------
class _Done:
    """A completed request (what :class:`PartComm`'s collectives return)."""

    @staticmethod
    def Test() -> bool:
        return True


class PartComm:
    """Part ``rank`` of a ``size``-part tensor group, alone on this process: split layers built
    over it have that part's shapes, and its collectives copy locally what they would deliver
    were every part's values this part's (no messages).  The cut's profile and memory use it."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = int(rank), int(size)

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.size

    def Iallreduce(self, send, recv, op=None) -> _Done:
        recv[0][...] = send[0]
        return _Done()

    def Iallgatherv(self, send, recv) -> _Done:
        x, out = send[0].reshape(-1), recv[0].reshape(-1)
        for count, displ in zip(*recv[1]):
            n = min(count, x.size)
            out[displ:displ + n] = x[:n]
        return _Done()


def unit_layers(layers: list, bounds: list[tuple[int, int]], comm) -> list[list]:
    """The split layers of ``layers`` (split whole, as a one-stage pipeline) that belong to each
    serial unit ``bounds[u]`` = [a, b): a gather of channels belongs to the layer that needs it."""
    full = split_tensor(layers, comm, close=True)
    starts = [len(split_tensor(layers[:a], comm)) for a, _ in bounds] + [len(full)]
    return [full[a:b] for a, b in zip(starts, starts[1:])]


def _bind_random(layers: list, rng, dtype) -> int:
    """Give ``layers`` fresh parameter and gradient arrays; their bytes."""
    n = 0
    for layer in layers:
        shapes = layer.param_shapes()
        params = {name: (0.05 * rng.standard_normal(shape)).astype(dtype) for name, shape in shapes}
        layer.bind(params, {name: np.zeros(shape, dtype) for name, shape in shapes})
        n += sum(p.nbytes for p in params.values())
    return n


def profile_split(layers: list, bounds: list[tuple[int, int]], parts: int, microbatch: int,
                  dtype, repeats: int = 3, seed: int = 0) -> list:
    """Each unit's :class:`psgd.pipeline.partition.UnitCost` split over ``parts`` (part 0, the
    widest of uneven splits), timed on this process (:class:`PartComm`: the collectives' own
    time is not counted).  ``in_bytes`` is the unit's whole input (what crosses a stage edge
    and is stored per microbatch in flight), ``out_bytes`` and ``param_bytes`` the part's.
    One unit's parameters are allocated at a time."""
    from psgd.pipeline.partition import UnitCost, time_unit
    dtype, rng = np.dtype(dtype), np.random.default_rng(seed)
    x = rng.standard_normal((microbatch, *layers[0].in_shape)).astype(dtype)
    costs, split = [], unit_layers(layers, bounds, PartComm(0, parts))
    for u, (a, _) in enumerate(bounds):
        unit, split[u] = split[u], None   # its arrays go with it after this unit
        param_bytes = _bind_random(unit, rng, dtype)
        best, fwd, out = time_unit(unit, x, repeats)
        whole_in = microbatch * int(np.prod(layers[a].in_shape)) * dtype.itemsize
        costs.append(UnitCost(best, whole_in, out.nbytes, param_bytes, fwd))
        x = out.copy()
    return costs


def part_param_bytes(layers: list, parts: int, itemsize: int) -> list[int]:
    """Bytes of each part's parameters when ``layers`` are one stage split over ``parts``
    (as :func:`stage_model` splits them; nothing is allocated)."""
    return [itemsize * sum(int(np.prod(shape)) for layer in split_tensor(layers, PartComm(t, parts),
                                                                          close=True)
                           for _, shape in layer.param_shapes())
            for t in range(parts)]


def split_stage_memory(costs: list, param_bytes: int, in_flight: int, keep: bool = False) -> int:
    """Bytes a split stage's part holds, as :func:`psgd.pipeline.partition.stage_memory` counts
    a whole stage: the part's parameters, gradient and accumulation, ``in_flight`` whole
    stored inputs and one microbatch's part activations (``keep``: each stored one's)."""
    return (3 * param_bytes + in_flight * costs[0].in_bytes
            + (in_flight if keep else 1) * sum(c.out_bytes for c in costs))


def best_split_cut(costs: list, layers: list, bounds: list[tuple[int, int]], parts: int,
                   itemsize: int, stages: int, in_flight, memory: int | None = None,
                   recompute: tuple[float, float] = (0.0, 0.0), keep: bool = False) -> list[int]:
    """:func:`psgd.pipeline.partition.best_cut` for stages split over ``parts``: the split
    units' times (:func:`profile_split`) and each candidate stage's widest part's parameter
    bytes (:func:`part_param_bytes` of its layers) against ``memory`` (``keep``: --recompute
    off, every stored microbatch's part activations counted)."""
    from psgd.pipeline.partition import min_max_cut, stage_time
    cache: dict = {}

    def param_bytes(i: int, j: int) -> int:
        if (i, j) not in cache:
            cache[i, j] = max(part_param_bytes(layers[bounds[i][0]:bounds[j - 1][1]], parts, itemsize))
        return cache[i, j]

    def fits(i: int, j: int, k: int) -> bool:
        return memory is None or split_stage_memory(costs[i:j], param_bytes(i, j), in_flight(k),
                                                    keep) <= memory

    counts = min_max_cut(len(costs), stages,
                         lambda i, j, last: stage_time(costs[i:j], 0.0, last, recompute), fits)
    if counts is None:
        need = max(split_stage_memory([c], param_bytes(u, u + 1), in_flight(0), keep)
                   for u, c in enumerate(costs))
        raise ValueError(f"no cut into {stages} stages split over {parts} parts fits "
                         f"--memory-per-rank {memory} bytes (the largest single unit alone needs "
                         f"{need} per part)")
    return counts


def split_cut(model, opts, parts: int, batch_size: int, in_flight) -> tuple[list[int], list]:
    """``--partition auto`` for stages split over ``parts``: the cut of ``model`` (the whole
    layer list, nothing allocated) by :func:`best_split_cut` on :func:`profile_split`'s costs
    (each backward re-runs its forward unless --recompute off), and those costs."""
    from psgd.pipeline.partition import recompute_shares, units
    bounds = units(model)
    costs = profile_split(model.layers, bounds, parts, batch_size // opts.microbatches, model.dtype)
    again = recompute_shares(opts.schedule, opts.stages, opts.microbatches) \
        if opts.recompute is not False else (0.0, 0.0)
    return best_split_cut(costs, model.layers, bounds, parts, model.dtype.itemsize, opts.stages,
                          in_flight, opts.memory_per_rank, again, keep=opts.recompute is False), costs
