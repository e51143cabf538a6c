"""Replica 0's step records while a pipeline trains: its last stage sends each logged step's
(step, loss, accuracy, seconds) to stage 0 as it is made, and stage 0 writes them to the log
between its own steps, where rank 0 also moves the progress bar."""
from __future__ import annotations

import numpy as np

from psgd.mpi import wait
from psgd.run.progress import progress_bar

TAG = 4903


class StepStream:
    """The step records of one pipeline run, streamed from the last stage to stage 0.

    Parameters
    ----------
    grid : psgd.pipeline.grid.Grid
        The run's grid (its ``row_comm`` joins a replica's stages).
    log : psgd.run.metrics.MetricsLog
        Rank 0's log (a closed one elsewhere).
    expected : int
        The records the last stage will send.
    bar : tuple (total, initial, enabled) or None
        Rank 0's progress bar over steps.
    """

    def __init__(self, grid, log, expected: int, bar=None) -> None:
        self.log, self.comm, self.left = log, grid.row_comm, int(expected)
        ends = grid.replica == 0 and grid.stage in (0, grid.stages - 1)
        self.local = ends and grid.stages == 1
        self.sender = ends and grid.stages > 1 and grid.stage == grid.stages - 1
        self.receiver = ends and grid.stages > 1 and grid.stage == 0
        self.sends: list = []
        self.row = np.zeros(4, np.float64)
        self.req = self._post() if self.receiver else None
        self.bar = progress_bar(*bar) if bar is not None else None

    def _post(self):
        return self.comm.Irecv(self.row, source=self.comm.Get_size() - 1, tag=TAG) \
            if self.left > 0 else None

    def add(self, step: int, loss: float, accuracy: float, seconds: float) -> None:
        """The last stage's record of ``step``: written here, or sent to stage 0."""
        row = np.array([step, loss, accuracy, seconds], np.float64)
        if self.local:
            self._write(row)
        elif self.sender:
            self.sends.append((self.comm.Isend(row, dest=0, tag=TAG), row))

    def poll(self, steps: int = 1) -> None:
        """Between steps: write the records that came; ``steps`` more on the progress bar."""
        while self.req is not None and self.req.Test():
            self._received()
        if self.bar is not None:
            self.bar.update(steps)

    def finish(self) -> None:
        """The last records written (stage 0) or their sends complete (the last stage)."""
        while self.req is not None:
            wait.wait(self.req, "the last stage to send its step records")
            self._received()
        for req, _ in self.sends:
            wait.wait(req, "stage 0 to take the step records")
        self.sends = []
        if self.bar is not None:
            self.bar.close()

    def _received(self) -> None:
        self._write(self.row.copy())
        self.left -= 1
        self.req = self._post()

    def _write(self, row: np.ndarray) -> None:
        step, loss, accuracy, seconds = row
        self.log.write("step", step=int(step), loss=loss, accuracy=accuracy, seconds=seconds)
