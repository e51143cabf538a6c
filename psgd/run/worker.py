"""A worker rank's part of `psgd train`: the step loop, logging, evaluation and progress on the lead."""
from __future__ import annotations

import math
import time

import numpy as np

from psgd.mpi import faults

from psgd.mpi import wait
from psgd.errors import PsgdError
from psgd.nn.finite import all_finite
from psgd.run.metrics import MetricsLog
from psgd.nn.optim import make_optimizer
from psgd.run.progress import progress_bar
from psgd.run.reports import TAG_FINAL_PARAMS, gather_reports, merge_histograms, write_checkpoint

TIMERS = ("push_s", "pull_s", "wait_s", "allreduce_s")


def _make_protocol(job):
    """The worker half of the job's protocol, and the optimizer it owns (or None)."""
    s, roles, cfg = job.settings, job.roles, job.config
    if s.protocol == "allreduce":
        from psgd.collectives.allreduce_worker import AllreduceWorker
        opt = make_optimizer(s.optimizer, job.model.n_params, **cfg.opt_hparams)
        if job.resume is not None:
            opt.load_state_dict(job.resume.opt_state)
        return AllreduceWorker(roles.worker_comm, opt, job.model.n_params,
                               skip_nonfinite=s.skip_nonfinite), opt
    if s.protocol == "hogwild":
        from psgd.hogwild.hogwild import HogwildWorker
        worker = HogwildWorker(roles, job.shard_map, cfg)
        return worker, getattr(worker, "optimizer", None)
    from psgd.ps.worker import make_ps_worker
    return make_ps_worker(roles, job.shard_map, cfg, overlap=s.overlap), None


class _Window:
    """Sums over the steps between two log records."""

    def __init__(self) -> None:
        self.reset(time.perf_counter())

    def reset(self, now: float) -> None:
        self.start, self.steps, self.loss, self.correct, self.samples = now, 0, 0.0, 0, 0

    def add(self, loss: float, correct: int, n: int) -> None:
        self.steps += 1
        self.loss += loss
        self.correct += correct
        self.samples += n


def run_worker(job) -> None:
    """Train this worker's shard of the data for the job's steps."""
    s, roles, model = job.settings, job.roles, job.model
    lead = roles.rank == roles.lead_worker
    reader = job.reader
    protocol, optimizer = _make_protocol(job)
    log = MetricsLog(s.log if lead else None, append=job.resume is not None and s.log is not None)
    x_test = y_test = None
    if lead:
        x_test, y_test = reader.test_set()
        if s.eval_samples:
            x_test, y_test = x_test[:s.eval_samples], y_test[:s.eval_samples]
        log.write("config", **s.as_dict(), n_workers=roles.n_workers, n_servers=roles.n_servers,
                  n_params=model.n_params, total_steps=job.total_steps, start_step=job.start_step)
    schedule = job.config.lr_schedule
    bar = progress_bar(job.total_steps, job.start_step, enabled=lead and not s.quiet)
    timers = dict.fromkeys(TIMERS + ("compute_s",), 0.0)
    window = _Window()
    last_timers = dict(timers)
    t_start = time.perf_counter()
    if roles.n_servers and s.protocol != "hogwild":
        protocol.start(model.params, clock=job.start_step)
    else:
        protocol.start(model.params)
    # a PS worker's push window: the servers of this node read the gradient where it is made
    grad_buffer = getattr(protocol, "grad_buffer", None)
    if grad_buffer is not None:
        model.use_grad_buffer(grad_buffer)
    test_acc = float("nan")
    fault = faults.for_rank(roles.rank)  # None unless PSGD_FAULT names this rank (tests)
    for clock in range(job.start_step, job.total_steps):
        x, y = reader.batch(clock)
        t0 = time.perf_counter()
        loss, correct = model.loss_and_grad(x, y)
        timers["compute_s"] += time.perf_counter() - t0
        if not s.skip_nonfinite and not (math.isfinite(loss) and all_finite(model.grad)):
            raise PsgdError(f"non-finite {'loss' if not math.isfinite(loss) else 'gradient'} at step "
                            f"{clock} on worker {roles.worker_index}; lower --lr or check the data "
                            f"(--skip-nonfinite skips such updates instead)")
        if fault is not None:
            fault.at(clock, model.grad)
        protocol.step(model.params, model.grad, clock, lr=schedule(clock))
        for key in TIMERS:
            timers[key] = float(protocol.stats.get(key, 0.0))
        window.add(loss, correct, len(y))
        step = clock + 1
        if lead and (step % s.log_every == 0 or step == job.total_steps):
            now = time.perf_counter()
            rate = window.samples / max(now - window.start, 1e-9)
            log.write("step", step=step, clock=clock, loss=window.loss / window.steps,
                      train_accuracy=window.correct / max(window.samples, 1),
                      samples_per_s=rate, est_global_samples_per_s=rate * roles.n_workers,
                      lr=schedule(clock),
                      staleness=protocol.stats.get("staleness"),
                      **{k: timers[k] - last_timers[k] for k in timers})
            postfix = {"loss": f"{window.loss / window.steps:.3f}"}
            if not math.isnan(test_acc):
                postfix["test_acc"] = f"{test_acc:.3f}"
            postfix["samples/s"] = f"{rate * roles.n_workers:.0f}"
            bar.set_postfix(postfix, refresh=False)
            last_timers = dict(timers)
            window.reset(now)
        if lead and s.eval_every and step % s.eval_every == 0 and step != job.total_steps:
            test_loss, test_acc = model.evaluate(x_test, y_test)
            log.write("eval", step=step, test_loss=test_loss, test_accuracy=test_acc)
        if (lead and s.checkpoint_dir and s.checkpoint_every and step % s.checkpoint_every == 0
                and step != job.total_steps and s.protocol in ("allreduce", "hogwild")):
            write_checkpoint(job, step, model.params, optimizer.state_dict() if optimizer else {})
        bar.update(1)
    if grad_buffer is not None:
        model.use_grad_buffer(None)   # finish() frees the window
    protocol.finish()
    bar.close()
    wall = time.perf_counter() - t_start
    if lead and roles.n_servers:
        wait.wait(roles.comm.Irecv(model.params, source=0, tag=TAG_FINAL_PARAMS),
                  "rank 0 to send the final parameters")
    final_ckpt = None
    if lead and s.checkpoint_dir and s.protocol in ("allreduce", "hogwild"):
        final_ckpt = write_checkpoint(job, job.total_steps, model.params,
                                      optimizer.state_dict() if optimizer else {})
    steps_done = job.total_steps - job.start_step
    reports = gather_reports(job, {"role": "worker", "rank": roles.rank, "wall_s": wall,
                                   "samples": steps_done * s.batch_size, **timers})
    if not lead:
        return
    test_loss, test_acc = model.evaluate(x_test, y_test)
    log.write("eval", step=job.total_steps, test_loss=test_loss, test_accuracy=test_acc)
    workers = [r for r in reports if r["role"] == "worker"]
    servers = [r for r in reports if r["role"] == "server"]
    samples = sum(r["samples"] for r in workers)
    summary = log.write(
        "summary", steps=job.total_steps, start_step=job.start_step, wall_s=wall,
        samples=samples, samples_per_s=samples / max(wall, 1e-9),
        test_loss=test_loss, test_accuracy=test_acc,
        staleness_histogram=merge_histograms(reports),
        worker_time={k: float(np.mean([r[k] for r in workers])) for k in TIMERS + ("compute_s",)},
        server_cpu_fraction=[r["cpu_s"] / r["wall_s"] if r["wall_s"] else 0.0 for r in servers],
        window_pushes=sum(r["n_window_pushes"] for r in servers),
        skipped_updates=sum(r["n_skipped"] for r in servers) + int(protocol.stats.get(
            "skipped", 0) if s.protocol == "allreduce" else 0))
    log.close()
    proto = s.protocol + (f" (s={s.staleness})" if s.protocol == "ssp" else "")
    print(f"psgd: {s.model} with {proto}, {roles.n_servers} server(s) + {roles.n_workers} worker(s): "
          f"{steps_done} steps in {wall:.1f} s, {summary['samples_per_s']:.0f} samples/s; "
          f"final test accuracy {test_acc:.4f} (loss {test_loss:.4f})", flush=True)
    if s.log:
        print(f"psgd: log: {s.log}", flush=True)
    if s.checkpoint_dir:
        from psgd.run.checkpoint import list_checkpoints
        newest = final_ckpt or (list_checkpoints(s.checkpoint_dir) or [None])[-1]
        print(f"psgd: checkpoint: {newest}", flush=True)
