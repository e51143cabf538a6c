"""PipeDream's asynchronous 1F1B: no flush, a step on every stage after each microbatch's backward."""
from __future__ import annotations

from psgd.collectives.allreduce import allreduce
from psgd.pipeline import pipemare
from psgd.pipeline.runtime import run_batch
from psgd.pipeline.schedules import stage_ops, versions_behind


class Microbatches:
    """Microbatch g of a run as ``batch(g // M)``'s part ``g % M``, each batch read once."""

    def __init__(self, batch, microbatches: int) -> None:
        self.batch, self.m = batch, microbatches
        self._index, self._parts = -1, None

    def __getitem__(self, g: int):
        b, i = divmod(g, self.m)
        if b != self._index:
            whole = self.batch(b)
            rows = whole.shape[0] // self.m
            self._index, self._parts = b, [whole[j * rows:(j + 1) * rows] for j in range(self.m)]
        return self._parts[i]


class AsyncTrainer:
    """Stage ``grid.stage`` under ``pipedream`` or ``pipemare``: every microbatch is a step.

    Microbatch g's backward is followed at once by the stage's optimizer step with its
    gradient (summed over the D replicas, ``scale = 1 / D``) at ``lr(g)``.  With weight
    stashing (the stage's ``stash``) the backward runs on the weights its forward used.
    ``anneal`` (PipeMare's T1, steps; None: off) scales the rate by
    :func:`psgd.pipeline.pipemare.rate`; ``correct`` (T2) runs each backward on
    :class:`psgd.pipeline.pipemare.Correction`'s estimate of the forward's weights.
    ``comp`` (a :class:`psgd.ps.compensation.base.Compensation`, or None) rewrites each
    step's gradient and rate as a server rewrites a push ``tau`` updates stale, given the
    weights the backward ran on as the push's read.
    """

    def __init__(self, stage, links, grid, optimizer, vertical: bool = False,
                 anneal: int | None = None, correct: bool = False, comp=None) -> None:
        self.stage, self.links, self.grid, self.optimizer = stage, links, grid, optimizer
        self.vertical, self.anneal, self.comp = vertical, anneal, comp
        stage.keep_read = comp is not None and comp.reads_params
        self.tau = versions_behind(grid.stages, grid.stage)
        self.correction = pipemare.Correction(grid.stages, grid.stage, stage.hi - stage.lo,
                                              stage.params.dtype) if correct else None
        if self.correction is not None:
            stage.predict = self.correction.predict
        self.versions: dict = {}
        self.busy = [0.0, 0.0]
        self.loss = 0.0       # the last stage's summed microbatch losses
        self.correct = 0

    def _compensated_step(self, rate: float) -> None:
        """One step with :attr:`comp`'s gradient and rate for the replicas' mean gradient."""
        stage = self.stage
        stage.acc *= 1.0 / self.grid.replicas
        read = stage.params if stage.read is None else stage.read
        grad, rate = self.comp.adjust(stage.acc, rate, self.tau, self.tau, stage.params, read)
        stage.read = None   # the copy is freed before the next forward
        self.optimizer.step(stage.params, grad, rate)

    def run(self, n: int, lr, xs=None, ys=None, g0: int = 0, first: int = 0) -> None:
        """Microbatches ``g0``..``g0 + n - 1`` of this process's run, drained at the end (a
        flush); ``xs``/``ys`` index them from 0 (as :class:`Microbatches`).  ``first`` is
        the first one's index in the whole training run (a resumed run's start, times M):
        ``lr(index)``, PipeMare's rescheduling and the dropout seeds follow it."""
        stage, grid = self.stage, self.grid

        def step(m: int) -> None:
            if grid.replicas > 1:
                allreduce(grid.replica_comm, stage.acc, "sum", label=f" of stage {grid.stage}")
            g = first + m
            rate = lr(g) * (1.0 if self.anneal is None else pipemare.rate(self.tau, g, self.anneal))
            before = stage.params.copy() if self.correction is not None and self.tau else None
            if self.comp is None:
                self.optimizer.step(stage.params, stage.acc, rate, scale=1.0 / grid.replicas)
            else:
                self._compensated_step(rate)
            if before is not None:
                self.correction.observe(before, stage.params)
            stage.acc[:] = 0.0
            if self.vertical:
                self.versions[m + 1] = stage.params.copy()
                self.versions.pop(m + 1 - grid.stage - 1, None)

        stage.begin_batch()
        if self.vertical:   # after a flush every stage starts from one version
            lag, self.versions = grid.stages - 1, {0: stage.params.copy()}
            stage.weights_for = lambda m: self.versions[max(0, m - lag)]
        ops = stage_ops("pipedream", grid.stages, grid.stage, n)
        loss, correct, busy = run_batch(stage, self.links, ops, g0, (grid.replica,), xs, ys,
                                        step, seed_from=first)
        self.loss, self.correct = self.loss + loss, self.correct + correct
        self.busy = [a + b for a, b in zip(self.busy, busy)]
