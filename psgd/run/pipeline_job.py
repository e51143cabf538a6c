"""`psgd train --pipeline K`: set-up agreed by every rank, the pipeline's steps, checkpoints, summary."""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from psgd.mpi import timeline, wait
from psgd.mpi.phase import phase
from psgd.nn.optim import make_optimizer
from psgd.pipeline import partition
from psgd.pipeline.asynchronous import Microbatches
from psgd.pipeline.evaluate import evaluate
from psgd.pipeline.grid import Grid, TensorGrid
from psgd.pipeline.local import stage_model
from psgd.pipeline.options import SERVER_SETTINGS
from psgd.pipeline.schedules import ASYNCHRONOUS, in_flight
from psgd.pipeline.trainer import build_trainer
from psgd.pipeline.transport import spin_seconds
from psgd.protocols import get
from psgd.run.job import agree, agreed_run_id, lr_by_clock, total_steps
from psgd.run import tensor_servers
from psgd.run.checkpoint import load_checkpoint
from psgd.run.metrics import MetricsLog
from psgd.run import pipeline_record, pipeline_summary
from psgd.run.pipeline_steps import StepStream
from psgd.run.pipeline_checkpoint import load_extra_state, resume_stage
from psgd.run.pipeline_checkpoint import save as save_stages
from psgd.run import tensor_pipeline_checkpoint as split_checkpoint
from psgd.run import tensor_pipeline_servers as split_servers
from psgd.run.mode_flags import PipelineFlags
from psgd.run.run_plan import refused_by
from psgd.run.settings import given_settings, resolve_run
from psgd.run.tensor_servers import ServerGroups, servers_of, workers_comm
from psgd.tensor import pipeline as tensor_stages
from psgd.tensor import spatial_stages

DEFAULT_PROTOCOL = "allreduce"


@dataclass
class PipelineRun:
    """What every rank set up before the first step."""

    settings: object
    options: object
    grid: Grid
    model: object
    trainer: object
    reader: object
    total: int
    start: int
    lr: object
    run_id: str
    counts: list
    groups: object = None   # the stage's parameter-server group (a server protocol)
    warm: tuple | None = None   # (clock, seconds waited, busy) when the first step ended
    opt_state: dict | None = None   # a resumed split part's optimizer state, for its servers


def _setup(args: argparse.Namespace, comm: MPI.Comm):
    given = given_settings(args)
    if "protocol" not in given:
        args.protocol = DEFAULT_PROTOCOL
    protocol = get(given.get("protocol", DEFAULT_PROTOCOL))
    split = any(given.get(name) for name in ("tensor", "spatial", "grid"))
    refused = split and (tensor_stages.refused(given, given.get("schedule", "1f1b"))
                         or protocol.servers and split_servers.refused(given))
    keep = (SERVER_SETTINGS if protocol.servers else ()) + (("tensor", "spatial", "grid") if split else ())
    refused = refused or refused_by(PipelineFlags(), given, keep=keep)
    if refused:
        raise ValueError(refused)
    settings, resumed = resolve_run(args)   # checks the pipeline's flags (psgd.run.mode_flags)
    wait.configure(stall_timeout=settings.stall_timeout, stall_abort=settings.stall_abort)
    opts = settings.pipeline.options()
    partition.check_stages(_skeleton(settings), opts.stages)
    n_servers = servers_of(settings)
    parts = tensor_stages.parts_of(settings)
    if n_servers:   # one group of servers per stage (per stage part when split)
        tensor_servers.check(settings, split_servers.groups(opts.stages, parts), "pipeline")
    if parts > 1:   # tensor-split stages
        tensor_stages.check_ranks(settings, opts.stages, comm.Get_size(), n_servers)
        opts = replace(opts, recompute=opts.recompute is not False)   # auto: on (the cut's memory)
    if comm.Get_size() <= n_servers or (comm.Get_size() - n_servers) % opts.stages:
        servers = f"{n_servers} servers + " if n_servers else ""
        raise ValueError(f"--pipeline {opts.stages}: the {comm.Get_size()} ranks are not "
                         f"{servers}D replicas x {opts.stages} stages (give {servers}a multiple "
                         f"of {opts.stages} ranks)")
    return settings, resumed, opts


def _skeleton(settings):
    """The model's layers with no parameters allocated (a stage of no layers); sparse models
    are refused."""
    from psgd.data.reader import dataset_info
    from psgd.nn import sparse
    info = dataset_info(settings.data)
    if sparse.is_sparse_spec(settings.model):
        raise ValueError(f"--pipeline cuts dense models into stages; {settings.model} is sparse")
    sparse.check_data_kind(settings.model, False, bool(info.get("sparse")), settings.data)
    return stage_model(settings, info, 0, 0)


def _cut(settings, opts, model) -> tuple[list[int], list | None, object]:
    """Units per stage (--partition's, or the profile's dynamic program), the profiled unit
    costs (None for given counts) and the options with --recompute auto decided.  Run on
    rank 0, whose cut every rank takes; the profile allocates one unit's parameters at a time."""
    counts = opts.counts()
    if counts is not None:
        partition.layer_bounds(model, counts)   # checks that they cover the model
        return counts, None, opts.resolved(lambda: True)
    from psgd.data.reader import dataset_info
    bound = lambda s: in_flight(opts.schedule, opts.stages, s, opts.microbatches)  # noqa: E731
    parts = tensor_stages.parts_of(settings)
    if parts > 1 and not getattr(settings.split, "spatial", None):   # tensor-split stages
        counts, costs = tensor_stages.split_cut(model, opts, parts, settings.batch_size, bound)
        return counts, costs, opts
    info = dataset_info(settings.data)
    costs = partition.profile(model, settings.batch_size // opts.microbatches,
                              unit_model=lambda a, b: stage_model(settings, info, a, b))
    if parts > 1:   # stages split by rows: each must hold a layer that splits
        return spatial_stages.split_cut(model, opts, parts, costs, bound), costs, opts

    def cut(recompute: bool) -> list[int]:
        again = partition.recompute_shares(opts.schedule, opts.stages, opts.microbatches) \
            if recompute else (0.0, 0.0)
        return partition.best_cut(costs, opts.stages, bound, opts.memory_per_rank,
                                  recompute=again, keep=not recompute)

    def fits() -> bool:
        try:
            return bool(cut(False))
        except ValueError:
            return False

    opts = opts.resolved(fits)
    return cut(opts.recompute), costs, opts


def _agreed_cut(comm: MPI.Comm, settings, opts, debug: bool) -> tuple[list[int], list | None, object]:
    """Rank 0's cut and --recompute on every rank (one line and exit 1 everywhere when it
    finds no cut)."""
    def on_rank0():
        if comm.Get_rank() != 0:
            return None, None, opts
        return _cut(settings, opts, _skeleton(settings))
    counts, costs, decided = agree(comm, on_rank0, debug, "cut the model into stages",
                                   "agreeing on the cut")
    buf = np.array([*(counts or [0] * opts.stages), bool(decided.recompute)], np.int64)
    wait.wait(comm.Ibcast(buf, root=0), "rank 0 to send the cut")
    return buf[:-1].tolist(), costs, replace(opts, recompute=bool(buf[-1]))


def _build_run(settings, opts, resumed, grid: Grid, run_id: str, counts,
               spin_s: float) -> PipelineRun:
    from psgd.data.reader import ShardReader, dataset_info
    info = dataset_info(settings.data)
    bounds = partition.layer_bounds(_skeleton(settings), counts)
    if getattr(grid, "parts", 1) > 1:
        return _build_split_run(settings, opts, resumed, grid, run_id, counts, info, bounds,
                                spin_s)
    model = stage_model(settings, info, *bounds[grid.stage])
    total = total_steps(settings, info, model, grid.replicas)
    hparams = {"momentum": settings.momentum, "weight_decay": settings.weight_decay}
    make = None if servers_of(settings) else \
        lambda n: make_optimizer(settings.optimizer, n, **hparams)  # noqa: E731
    start = resume_stage(settings, resumed, model, total)
    trainer = build_trainer(model, grid, opts, bounds, make, settings.batch_size, total - start,
                            whole=total, spin_s=spin_s)
    if start and trainer.optimizer is not None:   # with servers, the servers load theirs
        part = (model.offset, model.offset + model.n_params)
        state = load_checkpoint(resumed.path, part).opt_state
        load_extra_state(trainer, state)
        trainer.optimizer.load_state_dict(state)
    reader = None
    if trainer.stage.first or trainer.stage.last:
        reader = ShardReader(settings.data, grid.replica, grid.replicas, settings.batch_size,
                             seed=settings.seed, augment=settings.augment)
    return PipelineRun(settings, opts, grid, model, trainer, reader, total, start,
                       lr_by_clock(settings, total, model), run_id, list(counts))


def _build_split_run(settings, opts, resumed, grid, run_id: str, counts, info, bounds,
                     spin_s: float) -> PipelineRun:
    """:func:`_build_run` for tensor-split stages (psgd.run.tensor_pipeline_checkpoint)."""
    from psgd.data.reader import ShardReader
    model = tensor_stages.stage_model(settings, info, *bounds[grid.stage], grid.tensor_comm)
    total = total_steps(settings, info, model, grid.replicas)
    make = None if servers_of(settings) else lambda n: make_optimizer(  # noqa: E731
        settings.optimizer, n, momentum=settings.momentum, weight_decay=settings.weight_decay,
        dtype=model.dtype)
    start, state = split_checkpoint.resume(settings, resumed, model, total)
    trainer = tensor_stages.build_trainer(model, grid, opts, make, settings.batch_size,
                                          total - start, spin_s=spin_s, whole=total)
    if state is not None and make is not None:
        load_extra_state(trainer, state)
        trainer.optimizer.load_state_dict(state)
    reader = None
    if trainer.stage.first or trainer.stage.last:
        reader = ShardReader(settings.data, grid.replica, grid.replicas, settings.batch_size,
                             seed=settings.seed, augment=settings.augment)
    return PipelineRun(settings, opts, grid, model, trainer, reader, total, start,
                       lr_by_clock(settings, total, model), run_id, list(counts), opt_state=state)


def save(run: PipelineRun, step: int) -> None:
    """Write step ``step``'s checkpoint set (every rank calls it; split stages gather first)."""
    split = getattr(run.grid, "parts", 1) > 1
    (split_checkpoint.save if split else save_stages)(run, step)


def _train(run: PipelineRun, stream: StepStream) -> tuple[float, tuple]:
    """The steps, their records into ``stream``; the wall seconds and what the summary's idle
    and op times count (see :func:`_warmed`)."""
    wait.barrier(run.grid.p2p, "the other stages to start")
    # --timeline: one zero for every rank's clock, and the wall time's start
    t0 = timeline.start().zero if run.settings.traces.timeline else time.perf_counter()
    train = _train_asynchronous if run.options.schedule in ASYNCHRONOUS else _train_steps
    train(run, t0, stream)
    run.trainer.links.finish()
    if getattr(run.trainer, "worker", None) is not None:
        run.trainer.worker.finish()
    end = time.perf_counter()
    wall = end - t0
    stream.finish()
    wait.barrier(run.grid.p2p, "the other stages to finish their steps")
    if run.settings.traces.timeline:
        _save_timeline(run, wall)
    clock, waited, busy = run.warm or (t0, 0.0, [0.0, 0.0])
    steps = run.total - run.start - (run.warm is not None)
    measured = (end - clock, run.trainer.links.waited - waited,
                [a - b for a, b in zip(run.trainer.busy, busy)], steps, run.trainer.links.waited)
    return wall, measured


def _warmed(run: PipelineRun) -> None:
    """After a synchronous run's first step (of two or more): every stage starts the second
    together, and the summary's idle and op times count from there.  The first step holds
    one-off costs (compiling kernels, first touches of memory) that a neighbour would
    otherwise count as idle: they are not the schedule's bubble.  ``--timeline``: a span
    ``start`` from this stage's end of the first step to the second's start."""
    t = time.perf_counter()
    wait.barrier(run.grid.p2p, "the other stages to finish the first step")
    run.warm = (time.perf_counter(), run.trainer.links.waited, list(run.trainer.busy))
    if timeline.current is not None:
        timeline.current.span("start", t, run.warm[0], clock=run.start + 1)


def _save_timeline(run: PipelineRun, wall: float) -> None:
    """--timeline: every stage's forward, backward, send, receive and optimizer spans, one
    process per grid rank, written by its rank 0 (psgd.run.trace's Chrome trace)."""
    from psgd.run.trace import save_timeline
    timeline.current.wall = wall
    comm = run.grid.comm
    roles = SimpleNamespace(comm=comm, rank=comm.Get_rank(), lead_worker=0, n_servers=0)
    save_timeline(SimpleNamespace(roles=roles, settings=run.settings))


def _train_steps(run: PipelineRun, t0: float, steps: StepStream) -> None:
    s, trainer, stage = run.settings, run.trainer, run.trainer.stage
    for step in range(run.start, run.total):
        x = y = None
        if run.reader is not None:
            x, y = run.reader.batch(step)
            x = run.model._check_x(x) if stage.first else None
        loss, correct = trainer.step(step, run.lr(step), x, y if stage.last else None)
        done = step + 1
        if step == run.start and done < run.total and not s.recording.replay:
            _warmed(run)   # not under --replay: the recorded run met no barrier here
        if stage.last and _logged(run, done):
            steps.add(done, loss / run.options.microbatches, correct / s.batch_size,
                      time.perf_counter() - t0)
        steps.poll()
        if s.checkpoint_every and done % s.checkpoint_every == 0 and done < run.total:
            save(run, done)


def _train_asynchronous(run: PipelineRun, t0: float, steps: StepStream) -> None:
    """The run as one schedule, drained (flushed) at each --checkpoint-every step, where the
    checkpoint is written; one record (the mean loss over the run) from the last stage."""
    m, stage, reader = run.options.microbatches, run.trainer.stage, run.reader
    every = run.settings.checkpoint_every or run.total
    edges = [run.start, *range(run.start - run.start % every + every, run.total, every), run.total]
    for a, b in zip(edges, edges[1:]):
        batch = lambda i, part, a=a: reader.batch(a + i)[part]  # noqa: E731
        xs = Microbatches(lambda i: run.model._check_x(batch(i, 0)), m) if stage.first else None
        ys = Microbatches(lambda i: batch(i, 1), m) if stage.last else None
        run.trainer.run((b - a) * m, lambda g: run.lr(g // m), xs, ys,
                        g0=(a - run.start) * m, first=a * m)
        steps.poll(b - a)
        if b < run.total:
            save(run, b)
    n = (run.total - run.start) * m
    if stage.last:
        steps.add(run.total, run.trainer.loss / n,
                  run.trainer.correct / (n * (run.settings.batch_size // m)), time.perf_counter() - t0)


def _logged(run: PipelineRun, done: int) -> bool:
    return done % run.settings.log_every == 0 or done == run.total


def _step_stream(run: PipelineRun, log: MetricsLog, lead: bool) -> StepStream:
    """Replica 0's step records (one, the run's, under an asynchronous schedule) and rank 0's
    progress bar."""
    n = 1 if run.options.schedule in ASYNCHRONOUS else \
        sum(_logged(run, d) for d in range(run.start + 1, run.total + 1))
    bar = (run.total, run.start, not run.settings.quiet) if lead else None
    return StepStream(run.grid, log, n, bar)


def _evaluate(run: PipelineRun) -> tuple[float, float] | None:
    """Replica 0's test loss and accuracy on rank 0 (None elsewhere); the test rows stream
    through the stages (:func:`psgd.pipeline.evaluate.evaluate`), nothing is gathered."""
    model, reader, s, stage = run.model, run.reader, run.settings, run.trainer.stage
    test = calibration = None
    if run.grid.replica == 0 and (stage.first or stage.last):
        test = reader.test_set()
        if s.eval_samples:
            test = (test[0][:s.eval_samples], test[1][:s.eval_samples])
        if stage.first and model.any_batchnorm:
            from psgd.nn.model import CALIBRATION_SAMPLES
            calibration = model._check_x(reader.calibration_rows(CALIBRATION_SAMPLES)[0])
    return evaluate(model, run.grid, test, calibration)


def _announce(run: PipelineRun, counts: list[int], costs) -> None:
    """Rank 0: the grid, the cut and each stage's predicted time, parameters and input bytes."""
    opts, model = run.options, _skeleton(run.settings)   # the whole layer list
    servers = servers_of(run.settings)
    parts = getattr(run.grid, "parts", 1)
    spatial = bool(run.settings.split.spatial)
    split = f" x {parts} {'spatial' if spatial else 'tensor'} parts" if parts > 1 else ""
    over = f" over {servers} --protocol {run.settings.protocol} servers" if servers else ""
    print(f"psgd: pipeline of {opts.stages} stages{split} x {run.grid.replicas} replica(s){over}, "
          f"--schedule {opts.schedule}, {opts.microbatches} microbatch(es) of "
          f"{run.settings.batch_size // opts.microbatches}, cut {','.join(map(str, counts))}, "
          f"--recompute {'on' if opts.recompute else 'off'}", flush=True)
    edges = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    again = partition.recompute_shares(opts.schedule, opts.stages, opts.microbatches) \
        if opts.recompute else (0.0, 0.0)
    for s, (a, b) in enumerate(partition.layer_bounds(model, counts)):
        n = sum(int(np.prod(shape)) for layer in model.layers[a:b] for _, shape in layer.param_shapes())
        size = run.model.dtype.itemsize
        widest = n * size if spatial else \
            max(tensor_stages.part_param_bytes(model.layers[a:b], parts, size)) if parts > 1 else 0
        line = (f"psgd:   stage {s}: layers {a}..{b - 1} ({type(model.layers[a]).__name__} .. "
                f"{type(model.layers[b - 1]).__name__}), {n * size} parameter bytes"
                + (f" over {parts} parts (the widest part {widest})" if parts > 1 else ""))
        if costs is not None:
            part = costs[edges[s]:edges[s + 1]]
            ms = 1e3 * partition.stage_time(part, 0.0, s == opts.stages - 1, again)
            line += (f", predicted {ms:.2f} ms and "
                     f"{part[0].in_bytes} input bytes per microbatch")
        print(line, flush=True)


def _finish(run: PipelineRun, log: MetricsLog, wall: float, measured: tuple) -> None:
    """Summary, final checkpoint and evaluation; rank 0 prints and logs them."""
    summary = pipeline_summary.summary(run, wall, measured)
    if run.settings.checkpoint_dir:
        save(run, run.total)
    result = _evaluate(run)
    if summary is None:
        return
    idle = ", ".join(f"{f:.3f}" for f in summary["idle"])
    print(f"psgd: {summary['samples_per_s']:.1f} samples/s; idle per stage {idle} "
          f"(predicted bubble {summary['predicted_bubble']:.3f}); peak activation bytes "
          f"{[int(b) for b in summary['activation_bytes']]}; parameter bytes "
          f"{summary['param_bytes']}; peak RSS MiB "
          f"{[b >> 20 for b in summary['peak_rss_bytes']]}"
          + (f"; most stale push per stage {summary['max_staleness']}"
             if servers_of(run.settings) else ""), flush=True)
    loss, acc = result
    print(f"psgd: test loss {loss:.4f}, accuracy {acc:.4f}", flush=True)
    log.write("summary", pipeline=summary, test_loss=loss, test_accuracy=acc)


def train_pipeline(args: argparse.Namespace) -> None:
    """Entry point of ``psgd train --pipeline K`` on every rank (ranks 0..S-1 serve the
    stages' shards under a parameter-server protocol, the rest are the D x K grid)."""
    comm = MPI.COMM_WORLD
    debug = bool(getattr(args, "debug", False))
    settings, resumed, opts = agree(comm, lambda: _setup(args, comm), debug,
                                    "check the settings", "agreeing on the settings")
    with phase("agreeing on the run id"):
        run_id = agreed_run_id(comm, resumed)
    counts, costs, opts = _agreed_cut(comm, settings, opts, debug)
    with phase("counting the ranks on this node"):
        spin_s = spin_seconds(comm)   # every rank, servers too, counts against the cores
    n_servers, parts = servers_of(settings), tensor_stages.parts_of(settings)
    groups = ServerGroups(comm, settings, split_servers.groups(opts.stages, parts)) \
        if n_servers else None
    with phase("splitting into replicas and stages"):
        workers = workers_comm(comm, n_servers) if n_servers else comm
        grid = None if workers is None else \
            TensorGrid(workers, opts.stages, parts) if parts > 1 else Grid(workers, opts.stages)
    build = (lambda: None) if grid is None else \
        (lambda: _build_run(settings, opts, resumed, grid, run_id, counts, spin_s))
    run = agree(comm, build, debug, "read the data, build the stages and load the checkpoint",
                "agreeing that every stage could be built")
    if grid is None:
        state = groups.share(None, 0, hold_at_snapshots=True)
        pipeline_record.replay_into(comm, settings, groups, state[1], groups.total, debug)
        result = groups.serve(state)
        if settings.recording.record:
            pipeline_record.save(comm, settings, n_servers, groups.roles.n_workers, result.events,
                                 state[1], groups.total, run_id)
        return
    if groups is not None:
        run.groups = groups
        run.trainer.worker = _stage_worker(groups, run, resumed, debug)
    lead = workers.Get_rank() == 0
    if lead:
        _announce(run, counts, costs)
    log = MetricsLog(settings.log if lead else None, append=resumed is not None)
    wall, measured = _train(run, _step_stream(run, log, lead))
    _finish(run, log, wall, measured)
    log.close()
    run.grid.free()


def _stage_worker(groups: ServerGroups, run: PipelineRun, resumed, debug: bool):
    """The stage's worker half over its own servers, started on the stage's parameters (and a
    resumed run's optimizer state, which its servers take from the first replica)."""
    params, model, first = run.trainer.stage.params, run.model, run.grid.replica == 0
    state = None
    if resumed is not None and first:   # a split part's was read with its parameters
        state = run.opt_state if getattr(run.grid, "parts", 1) > 1 else \
            load_checkpoint(resumed.path, (model.offset, model.offset + model.n_params)).opt_state
    groups.share(params if first else None, run.total, run.start, state,   # the first replica's
                 hold_at_snapshots=True)
    pipeline_record.replay_into(MPI.COMM_WORLD, run.settings, groups, run.start, run.total, debug)
    worker = split_servers.stage_worker(groups.worker(), run)
    worker.start(params, run.start)
    return worker
