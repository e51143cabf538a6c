"""A worker rank's part of `psgd train`: the step loop over its shard of the data."""
from __future__ import annotations

import math
import time

import numpy as np

from psgd.errors import PsgdError
from psgd.kernels.finite import finite
from psgd.mpi import faults, timeline, wait
from psgd.mpi.phase import phase
from psgd.run.lead import PROTOCOL_TIMERS, TIMERS, Lead
from psgd.run.reports import TAG_FINAL_PARAMS, gather_reports

MAX_RUN = 1024   # the most steps a worker takes in one run between stop checks


def _start_protocol(job, worker) -> None:
    """Start the worker half of the protocol on the model's parameters."""
    t_start = time.perf_counter()
    if job.resume is not None and worker.optimizer is not None and job.protocol.can("resume-optimizer"):
        worker.optimizer.load_state_dict(job.resume.opt_state)
    velocity = job.resume.opt_state.get("velocity") if job.resume is not None else None
    if worker.momentum is not None and velocity is not None:
        # momentum correction: the step's velocity is the mean of the workers' last pushes
        worker.momentum.velocity[:] = velocity
    worker.start(job.model.params, clock=job.start_step)
    if worker.grad_buffer is not None:   # the servers of this node read the gradient there
        job.model.use_grad_buffer(worker.grad_buffer)
    if timeline.current is not None:
        timeline.current.span("start", t_start, time.perf_counter(), job.start_step)


def _train_step(job, worker, clock: int, timers: dict, fault) -> tuple[float, int, int]:
    """One clock: a batch, its gradient, the protocol's step; returns (loss, correct, n)."""
    s, model = job.settings, job.model
    t_data = time.perf_counter()
    x, y = job.reader.batch(clock)
    t_read = time.perf_counter()
    worker.before_batch(model.params, x)   # hogwild reads a sparse model's rows of this batch
    t0 = time.perf_counter()
    if model.stochastic:   # dropout masks fixed by (seed, worker, step): a resume draws the same
        model.reseed(job.roles.worker_index, clock)
    loss, correct = model.loss_and_grad(x, y)
    t1 = time.perf_counter()
    timers["compute_s"] += t1 - t0
    t_step = t1
    if job.straggler is not None:
        job.straggler.after_compute(clock, t1 - t0)
        timers["straggle_s"] = job.straggler.slept_s
        t_step = time.perf_counter()
    if not s.skip_nonfinite and not (math.isfinite(loss) and finite(model.grad)):
        raise _nonfinite(job, "loss" if not math.isfinite(loss) else "gradient", clock)
    if fault is not None:
        fault.at(clock, model.grad)
    worker.step(model.params, model.grad, clock, lr=job.config.lr_schedule(clock))
    if timeline.current is not None:
        tl = timeline.current
        tl.span("data", t_data, t_read, clock)
        tl.span("compute", t0, t1, clock)
        if t_step > t1:
            tl.span("straggle", t1, t_step, clock)
        tl.span("step", t_step, time.perf_counter(), clock, worker.stats.get("staleness", -1))
    for key in PROTOCOL_TIMERS:
        timers[key] = float(worker.stats.get(key, 0.0))
    timers["push_bytes"] = worker.stats.get("push_bytes", 0)
    if "pull_bytes" in worker.stats:
        timers["pull_bytes"] = worker.stats["pull_bytes"]
    return loss, correct, len(y)


def _nonfinite(job, what: str, clock: int) -> PsgdError:
    return PsgdError(f"non-finite {what} at step {clock} on worker {job.roles.worker_index}; lower "
                     f"--lr or check the data (--skip-nonfinite skips such updates instead)")


def _runs_steps(job, worker, fault) -> bool:
    """Whether this worker takes its steps in runs (hogwild's :meth:`run_steps`) rather than
    one by one: nothing per step needs Python (no --straggler, dropout or PSGD_X_FAULT)."""
    return (worker.runs_steps() and job.straggler is None and fault is None
            and not job.model.stochastic and job.reader.rows_in_runs)


def _prepare(job, worker, fault) -> bool:
    """Set-up before the training clock starts; returns :func:`_runs_steps`."""
    worker.use_model(job.model)   # hogwild pushes a sparse model's touched rows only
    runs = _runs_steps(job, worker, fault)
    if runs:   # numba's first call of the run kernel is set-up, not training: take none
        worker.run_steps(job.model.params, job.reader.x, job.reader.y, np.zeros(0, np.int64),
                         job.start_step, np.zeros(0))
    return runs


def _run_length(s, clock: int, total: int) -> int:
    """Steps from ``clock`` up to the next one after which the loop has work (a log record, an
    evaluation, a checkpoint, the end), at most MAX_RUN."""
    end = min(total, clock + MAX_RUN)
    for every in (s.log_every, s.eval_every, s.checkpoint_every):
        if every:
            end = min(end, (clock // every + 1) * every)
    return end - clock


def _train_run(job, worker, clock: int, steps: int, timers: dict) -> tuple:
    """``steps`` clocks from ``clock`` in one call of the worker; returns (losses, corrects, n)."""
    reader, model = job.reader, job.model
    t_data = time.perf_counter()
    rows = reader.batch_rows(clock, steps)
    lrs = np.array([job.config.lr_schedule(c) for c in range(clock, clock + steps)], np.float64)
    t0 = time.perf_counter()
    losses, corrects, done, status = worker.run_steps(model.params, reader.x, reader.y, rows, clock, lrs)
    t1 = time.perf_counter()
    if status:
        raise _nonfinite(job, "loss" if not math.isfinite(losses[done]) else "gradient", clock + done)
    timers["compute_s"] += t1 - t0   # the reads and adds are inside the one call
    if timeline.current is not None:
        timeline.current.span("data", t_data, t0, clock)
        timeline.current.span("compute", t0, t1, clock)
    for key in PROTOCOL_TIMERS:
        timers[key] = float(worker.stats.get(key, 0.0))
    timers["push_bytes"] = worker.stats["push_bytes"]
    timers["pull_bytes"] = worker.stats["pull_bytes"]
    return losses, corrects, reader.batch_size


def _advance(job, worker, clock: int, runs: bool, timers: dict, fault) -> tuple:
    """The step at ``clock``, or (``runs``) a run of steps from it; returns (the last clock
    taken, their losses, their correct counts, samples per step)."""
    if not runs:
        loss, correct, n = _train_step(job, worker, clock, timers, fault)
        return clock, (loss,), (correct,), n
    steps = _run_length(job.settings, clock, job.total_steps)
    losses, corrects, n = _train_run(job, worker, clock, steps, timers)
    return clock + steps - 1, losses, corrects, n


def _replica_checkpoint(job, worker, step: int, params=None):
    """The lead's checkpoint of its own replica (``params``: the workers' mean model instead),
    where the servers take none."""
    opt = worker.optimizer
    params = job.model.params if params is None else params
    return job.save_checkpoint(step, params, opt.state_dict() if opt else {})


def _saves_at(s, step: int, total: int) -> bool:
    """Whether a checkpoint is written after ``step`` (the last one is written after the loop)."""
    return bool(s.checkpoint_every and step % s.checkpoint_every == 0 and step != total)


def averages_at(s, step: int, total: int) -> bool:
    """Whether the decentralized workers average their models after ``step``: for a log
    record, an evaluation or a checkpoint (the same on every worker)."""
    return (step % s.log_every == 0 or step == total or bool(s.eval_every and step % s.eval_every == 0)
            or bool(s.checkpoint_dir and s.checkpoint_every and step % s.checkpoint_every == 0))


def run_worker(job) -> None:
    """Train this worker's shard of the data for the job's steps."""
    s, roles, model = job.settings, job.roles, job.model
    lead = Lead(job) if roles.rank == roles.lead_worker else None
    own_checkpoints = lead is not None and s.checkpoint_dir and not job.protocol.can("server-snapshots")
    timers = dict.fromkeys(TIMERS, 0.0)
    with phase("making the worker"):
        worker = job.protocol.make_worker(roles, job.shard_map, job.config)
    job.stop.serve = worker.serve
    fault = faults.for_rank(roles.rank)  # None unless PSGD_X_FAULT names this rank (tests)
    runs = _prepare(job, worker, fault)
    t_start = time.perf_counter()
    with phase("starting the protocol"):
        _start_protocol(job, worker)
    with phase("training", watch=False):
        end, consensus, mean = _train(job, worker, lead, runs, timers, fault)
    t_finish = time.perf_counter()
    with phase("finishing the protocol"):
        if worker.grad_buffer is not None:
            model.use_grad_buffer(None)   # finish() frees the window
        worker.finish()
        if mean is not None:
            consensus = worker.average(model.params, mean)
    with phase("agreeing where training ended"):
        job.end_step = job.stop.close(end)   # the slowest worker's
        job.stop.share_end(job.end_step)
    wall = time.perf_counter() - t_start
    tl = timeline.current
    if tl is not None:
        tl.span("finish", t_finish, t_start + wall, end)
        tl.wall = wall
    if lead is not None:
        lead.bar.close()
        if roles.n_servers:
            with phase("taking the final parameters"):
                wait.wait(roles.comm.Irecv(model.params, source=0, tag=TAG_FINAL_PARAMS),
                          "rank 0 to send the final parameters")
    final_ckpt = _replica_checkpoint(job, worker, job.end_step, mean) if own_checkpoints else None
    _report(job, worker, lead, {"wall_s": wall, "samples": (end - job.start_step) * s.batch_size,
                                "steps": end - job.start_step, **timers}, mean, consensus,
            final_ckpt, fault)


def _train(job, worker, lead, runs: bool, timers: dict, fault) -> tuple:
    """The step loop; returns (the clock it ended at, the last consensus distance, the mean
    model buffer of a decentralized protocol or None)."""
    s, model = job.settings, job.model
    own_checkpoints = lead is not None and s.checkpoint_dir and not job.protocol.can("server-snapshots")
    tl = timeline.current
    # decentralized protocols: the workers' models differ; their mean is logged and saved
    mean = np.empty_like(model.params) if job.protocol.decentralized else None
    consensus = None
    end, clock = job.total_steps, job.start_step
    while clock < job.total_steps:
        if job.stop.check(clock):
            end = clock
            break
        clock, losses, corrects, n = _advance(job, worker, clock, runs, timers, fault)
        step = clock + 1
        if mean is not None and averages_at(s, step, job.total_steps):
            consensus = worker.average(model.params, mean)
        t_lead = time.perf_counter()
        saves = own_checkpoints and _saves_at(s, step, job.total_steps)
        if lead is not None and (saves or lead.evaluates_at(step)):
            worker.read_all(model.params)   # a worker that reads only its batches' rows
        if lead is not None:
            lead.after_steps(clock, losses, corrects, n, timers, worker.stats.get("staleness"),
                             consensus, mean, worker.stats.get("bound"))
        if saves:
            _replica_checkpoint(job, worker, step, mean)
        if lead is not None and tl is not None:
            tl.span("lead", t_lead, time.perf_counter(), clock)
        clock += 1
    return end, consensus, mean


def _report(job, worker, lead, report: dict, mean, consensus, final_ckpt, fault) -> None:
    """This worker's end-of-run report to the lead; on the lead, the run's summary."""
    with phase("final gather"):
        if fault is not None:   # a fault at step >= the run's steps: at the final gather (tests)
            fault.at(job.total_steps)
        reports = gather_reports(job, {
            "role": "worker", "rank": job.roles.rank,
            "compensation": worker.compensation,
            "bytes_sent": worker.stats.get("bytes_sent"),
            "push_bytes": worker.stats.get("push_bytes"),
            "skipped": int(worker.stats.get("skipped", 0)), **report})
    if lead is not None:
        skipped = 0 if job.roles.n_servers else int(worker.stats.get("skipped", 0))
        if mean is not None:   # each worker skips its own gradients
            skipped = sum(r["skipped"] for r in reports if r["role"] == "worker")
        lead.print_summary(lead.summary(reports, report["wall_s"], skipped, mean, consensus),
                           report["wall_s"], final_ckpt)
