"""A pipeline's training step on one rank: the schedule, the replicas' all-reduce, the optimizer step."""
from __future__ import annotations

import time

from psgd.collectives.allreduce import allreduce
from psgd.mpi import timeline
from psgd.pipeline.runtime import run_batch, split
from psgd.pipeline.schedules import stage_ops


class PipelineTrainer:
    """Stage ``stage`` of a pipeline, replica ``replica`` of ``grid.replicas``.

    Each step accumulates the M microbatch gradients in backward order, sums them over
    the stage's replicas (psgd's all-reduce), and steps ``optimizer`` (made for the
    stage's slice) with ``scale = 1 / (M D)``: the mean over the D x M microbatches.
    With :attr:`worker` set (a parameter-server protocol's worker half, started, over the
    stage's own servers), the step pushes the mean over the M microbatches instead, and
    the servers' rule combines the D replicas' pushes; the next parameters are pulled.
    """

    def __init__(self, stage, links, grid, options, optimizer) -> None:
        self.stage, self.links, self.grid, self.options = stage, links, grid, options
        self.optimizer = optimizer
        self.worker = None
        self.ops = stage_ops(options.schedule, grid.stages, grid.stage, options.microbatches)
        self.busy = [0.0, 0.0]   # seconds in forwards, in backwards
        self.steps_run = 0

    def step(self, step: int, lr: float, x=None, y=None) -> tuple[float, int]:
        """One batch (``x`` on the first stage, ``y`` on the last); the summed microbatch
        losses and correct count on the last stage (zeros elsewhere)."""
        m = self.options.microbatches
        stage = self.stage
        stage.begin_batch()
        xs = split(x, m) if stage.first else None
        ys = split(y, m) if stage.last else None
        loss, correct, busy = run_batch(stage, self.links, self.ops, self.steps_run * m,
                                        (self.grid.replica, step), xs, ys)
        self.busy = [a + b for a, b in zip(self.busy, busy)]
        t = time.perf_counter()
        if self.worker is not None:
            stage.acc *= stage.acc.dtype.type(1.0 / m)
            self.worker.step(stage.params, stage.acc, step)
        else:
            if self.grid.replicas > 1:
                allreduce(self.grid.replica_comm, stage.acc, "sum",
                          label=f" of stage {self.grid.stage}")
            self.optimizer.step(stage.params, stage.acc, lr, scale=1.0 / (m * self.grid.replicas))
        if timeline.current is not None:
            timeline.current.span("optimizer", t, time.perf_counter(), clock=step)
        self.steps_run += 1
        return loss, correct


def slots(options, stages: int, stage: int, total: int) -> int:
    """Receive buffers per direction on ``stage``: its bound on in-flight microbatches plus
    one (``total``: the run's microbatches, which an asynchronous schedule runs as one)."""
    from psgd.pipeline.schedules import ASYNCHRONOUS, in_flight
    m = total if options.schedule in ASYNCHRONOUS else options.microbatches
    return min(m, in_flight(options.schedule, stages, stage, m) + 1)


def stage_comp(name: str, optimizer):
    """``--stage-comp name``'s method (psgd.ps.compensation) for a stage's ``optimizer``, as
    on a server's shard with one worker; None for ``none``."""
    if name == "none":
        return None
    from types import SimpleNamespace

    from psgd.ps.compensation import make
    settings = SimpleNamespace(staleness_comp=name, comp_lambda=None, amom_warmup=None)
    config = SimpleNamespace(compensation=settings, worker_momentum=None)
    return make(name, config, optimizer, optimizer.n)


def build_trainer(model, grid, options, bounds, make_optimizer, batch_size: int,
                  batches: int, whole: int | None = None, spin_s: float = 0.0) -> PipelineTrainer:
    """This rank's trainer: stage ``grid.stage`` over layers ``bounds[grid.stage]``, its links
    sized for ``batches`` steps of ``batch_size`` rows (``whole``: the training run's steps,
    a resumed one's from step 0, default ``batches``), ``make_optimizer(n)`` for its slice
    (None: the servers own the optimizer); ``spin_s``: the links' yield spin before a wait
    sleeps (psgd.pipeline.transport.spin_seconds)."""
    from psgd.pipeline.asynchronous import AsyncTrainer
    from psgd.pipeline.schedules import ASYNCHRONOUS
    from psgd.pipeline.stage import Stage
    from psgd.pipeline.transport import Links
    k, s = grid.stages, grid.stage
    a, b = bounds[s]
    asynchronous = options.schedule in ASYNCHRONOUS
    stash = options.schedule == "pipedream" and options.stash
    stage = Stage(model, a, b, first=s == 0, last=s == k - 1, stash=stash,
                  keep=not options.recomputes)
    micro, total = batch_size // options.microbatches, batches * options.microbatches
    shape_in = (micro, *model.layers[a].in_shape)
    shape_out = (micro, *model.layers[b - 1].out_shape)
    links = Links(grid.p2p, s, grid.prev, grid.next, shape_in, shape_out, model.dtype,
                  slots(options, k, s, total), slots(options, k, s + 1, total) if s + 1 < k else 0,
                  slots(options, k, s - 1, total) if s > 0 else 0, total, spin_s)
    optimizer = make_optimizer(stage.hi - stage.lo) if make_optimizer is not None else None
    if options.schedule == "pipemare":
        from psgd.pipeline.pipemare import default_anneal
        whole = (whole or batches) * options.microbatches
        anneal = default_anneal(whole) if options.anneal is None else options.anneal
        return AsyncTrainer(stage, links, grid, optimizer, anneal=anneal or None,
                            correct=options.correct, comp=stage_comp(options.comp, optimizer))
    if asynchronous:
        return AsyncTrainer(stage, links, grid, optimizer, vertical=options.vertical_sync,
                            comp=stage_comp(options.comp, optimizer))
    return PipelineTrainer(stage, links, grid, options, optimizer)
