"""PipeDream's asynchronous 1F1B: no flush, a step on every stage after each microbatch's backward."""
from __future__ import annotations

from psgd.collectives.allreduce import allreduce
from psgd.pipeline.runtime import run_batch
from psgd.pipeline.schedules import stage_ops


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
    """Stage ``grid.stage`` under ``pipedream``: every microbatch is a step.

    Microbatch g's backward is followed at once by the stage's optimizer step with its
    gradient (summed over the D replicas, ``scale = 1 / D``) at ``lr(g)``.  With weight
    stashing (the stage's ``stash``) the backward runs on the weights its forward used.
    """

    def __init__(self, stage, links, grid, optimizer, vertical: bool = False) -> None:
        self.stage, self.links, self.grid, self.optimizer = stage, links, grid, optimizer
        self.vertical = vertical
        self.versions = {0: stage.params.copy()} if vertical else {}
        self.busy = [0.0, 0.0]
        self.loss = 0.0       # the last stage's summed microbatch losses
        self.correct = 0

    def run(self, n: int, lr, xs=None, ys=None) -> None:
        """Microbatches 0..n-1 (``xs``/``ys`` indexable by g, as :class:`Microbatches`)."""
        stage, grid = self.stage, self.grid

        def step(g: int) -> None:
            if grid.replicas > 1:
                allreduce(grid.replica_comm, stage.acc, "sum", label=f" of stage {grid.stage}")
            self.optimizer.step(stage.params, stage.acc, lr(g), scale=1.0 / grid.replicas)
            stage.acc[:] = 0.0
            if self.vertical:
                self.versions[g + 1] = stage.params.copy()
                self.versions.pop(g + 1 - grid.stage - 1, None)

        stage.begin_batch()
        if self.vertical:
            lag = grid.stages - 1
            stage.weights_for = lambda g: self.versions[max(0, g - lag)]
        ops = stage_ops("pipedream", grid.stages, grid.stage, n)
        self.loss, self.correct, self.busy = run_batch(stage, self.links, ops, 0, (grid.replica,),
                                                       xs, ys, step)
