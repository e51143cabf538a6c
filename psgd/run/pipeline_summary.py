"""A pipeline run's summary: every stage's idle and op times, memory and staleness, gathered
to rank 0 beside the schedule's predicted bubble and its simulation from the measured ops."""
from __future__ import annotations

import resource

import numpy as np
from mpi4py import MPI

from psgd.mpi import wait
from psgd.pipeline.schedules import ASYNCHRONOUS, predicted_bubble, simulate


def summary(run, wall: float, measured: tuple) -> dict | None:
    """Every stage's idle fraction and op times (over ``measured``: seconds, seconds waited,
    busy seconds and steps, see :func:`psgd.run.pipeline_job._warmed`; then the whole run's seconds waited), peak
    stored activation bytes, parameter bytes and peak resident memory (the process's), on
    rank 0; samples/s and ``idle_with_first_step`` over the whole run."""
    stage, opts = run.trainer.stage, run.options
    seconds, waited, busy, measured_steps, waited_all = measured
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB
    mine = np.array([wall, waited, stage.activation_bytes,
                     stage.params.nbytes, stage.peak_inputs, *busy, rss,
                     _max_staleness(run), seconds, waited_all], np.float64)
    rows = np.zeros((run.grid.stages, 11)) if run.grid.stage == 0 else None
    wait.wait(run.grid.row_comm.Igather(mine, rows, root=0), "the stages to send their summary")
    if rows is None or run.grid.replica != 0 or getattr(run.grid, "part", 0):
        return None
    steps = run.total - run.start
    per_op = rows[:, 5:7] / (measured_steps * opts.microbatches)   # seconds per microbatch op
    # microbatches between flushes: a batch's, or (asynchronous) the whole run's
    m = steps * opts.microbatches if opts.schedule in ASYNCHRONOUS else opts.microbatches
    return {"stages": opts.stages, "microbatches": opts.microbatches, "schedule": opts.schedule,
            "cut": run.counts,
            "replicas": run.grid.replicas, "steps": steps,
            "samples_per_s": steps * run.settings.batch_size * run.grid.replicas / rows[:, 0].max(),
            # from the second step on (synchronous schedules; asynchronous: the whole run)
            "measured_samples_per_s": measured_steps * run.settings.batch_size * run.grid.replicas
            / rows[:, 9].max(),
            "predicted_bubble": predicted_bubble(opts.stages, m),
            "simulated_idle": simulate(opts.schedule, opts.stages, m, per_op[:, 0], per_op[:, 1]),
            "forward_s": per_op[:, 0].tolist(), "backward_s": per_op[:, 1].tolist(),
            "measured_steps": measured_steps,
            "idle": (rows[:, 1] / rows[:, 9]).tolist(),
            "idle_with_first_step": (rows[:, 10] / rows[:, 0]).tolist(), "activation_bytes": rows[:, 2].tolist(),
            "peak_microbatches": rows[:, 4].astype(int).tolist(),
            "param_bytes": rows[:, 3].astype(int).tolist(),
            "peak_rss_bytes": rows[:, 7].astype(int).tolist(),
            "max_staleness": rows[:, 8].astype(int).tolist()}


def _max_staleness(run) -> int:
    """The most clocks a push of this stage's replicas was stale (0 without servers)."""
    worker = getattr(run.trainer, "worker", None)
    most = np.array([worker.stats["max_staleness"] if worker is not None else 0], np.int64)
    if run.grid.replicas > 1:
        wait.wait(run.grid.replica_comm.Iallreduce(MPI.IN_PLACE, most, MPI.MAX),
                  "the stage's replicas to send their staleness")
    return int(most[0])
