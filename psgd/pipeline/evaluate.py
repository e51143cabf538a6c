"""Evaluating a pipeline without gathering the model: the test set streams through the stages."""
from __future__ import annotations

import numpy as np

from psgd.mpi import wait
from psgd.nn.model import CALIBRATION_BATCH

TAG = 4907


def evaluate(model, grid, test=None, calibration=None, batch: int = 64) -> tuple | None:
    """Replica 0's mean test loss and accuracy on its stage 0 (None elsewhere).

    ``model`` is this rank's :class:`psgd.pipeline.local.StageModel`; ``test`` is
    ``(x, y)`` on the first stage (x) and the last (y); ``calibration`` the batch-norm
    rows on the first stage.  Each stage runs its layers as
    :meth:`psgd.nn.model.Model.evaluate` runs them, chunk by chunk, so the result is the
    whole model's.  Collective over replica 0's stages; other replicas return None.
    """
    if grid.replica != 0:
        return None
    first, last = grid.stage == 0, grid.stage == grid.stages - 1
    sizes = np.zeros(2, np.int64)
    if first:
        sizes[:] = (calibration.shape[0] if calibration is not None else 0, test[0].shape[0])
    wait.wait(grid.row_comm.Ibcast(sizes, root=0), "stage 0 to send the evaluation's sizes")
    bns = model.batchnorms
    for bn in bns:
        bn.begin_calibration()
    _stream(model, grid, "calibrate", int(sizes[0]), CALIBRATION_BATCH,
            calibration if first else None)
    for bn in bns:
        bn.end_calibration()
    totals = np.zeros(2, np.float64)
    y = model._check_y(test[1], test[1].shape[0]) if last else None

    def score(s: int, logits: np.ndarray) -> None:
        loss, correct = model._loss(logits, y[s:s + logits.shape[0]])
        totals[:] += (loss * logits.shape[0], correct)

    _stream(model, grid, "eval", int(sizes[1]), batch, test[0] if first else None, score)
    if grid.stages > 1 and (first or last):
        req = grid.row_comm.Isend(totals, dest=0, tag=TAG) if last else \
            grid.row_comm.Irecv(totals, source=grid.stages - 1, tag=TAG)
        wait.wait(req, "the last stage to send the test loss")
    return (totals[0] / sizes[1], totals[1] / sizes[1]) if first else None


def _stream(model, grid, mode: str, n: int, chunk: int, x=None, score=None) -> None:
    """Rows ``0..n-1`` through this stage's layers in ``mode``, ``chunk`` rows at a time:
    read from ``x`` on the first stage, received from the previous stage elsewhere; sent on,
    or on the last stage handed to ``score(start, logits)``."""
    layers = model.layers[model.a:model.b]
    comm, s = grid.row_comm, grid.stage
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        if s == 0:
            a = model._check_x(x[start:start + rows])
        else:
            a = np.empty((rows, *layers[0].in_shape), model.dtype)
            wait.wait(comm.Irecv(a, source=s - 1, tag=TAG), f"stage {s - 1}'s {mode} rows {start}")
        for layer in layers:
            layer.set_mode(mode)
            a = layer.forward(a)
        if s == grid.stages - 1:
            if score is not None:
                score(start, a)
        else:
            wait.wait(comm.Isend(np.ascontiguousarray(a), dest=s + 1, tag=TAG),
                      f"stage {s + 1} to take the {mode} rows {start}")
