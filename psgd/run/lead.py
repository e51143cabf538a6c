"""The lead worker's extra part: the metrics log, evaluation, the progress bar and the run summary."""
from __future__ import annotations

import math
import time

import numpy as np

from psgd.env import psgd_variables
from psgd.nn.model import CALIBRATION_SAMPLES
from psgd.run.metrics import MetricsLog
from psgd.run.progress import progress_bar
from psgd.run.reports import merge_histograms
from psgd.run.settings import FLAG_VARIABLES
from psgd.run.signals import EXIT_STOPPED, signal_name

PROTOCOL_TIMERS = ("push_s", "pull_s", "wait_s", "allreduce_s")   # the protocol's worker.stats
TIMERS = PROTOCOL_TIMERS + ("compute_s", "straggle_s")   # straggle_s: --straggler's sleeps


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


def _float32_bytes(n_servers: int, n_workers: int, n_params: int) -> float:
    """What a worker sends per step uncompressed: a float32 push (with servers), else the
    float32 ring's 2(W-1)/W x 4 bytes per parameter; the compression ratio's numerator."""
    return 4 * n_params if n_servers else 2 * (n_workers - 1) / n_workers * 4 * n_params


def _push_bytes(servers: list[dict], n_params: int) -> dict:
    """Bytes of one push over all shards as the servers received them, and float32's ratio."""
    pushes = max((r["n_pushes"] for r in servers), default=0)
    if not pushes:
        return {}
    per_push = sum(r["push_bytes"] for r in servers) / pushes
    return {"push_bytes": per_push,
            "compression_ratio": _float32_bytes(len(servers), 0, n_params) / per_push}


def _allreduce_bytes(workers: list[dict], steps: int, n_params: int) -> dict:
    """Without servers: bytes a worker handed to MPI per step (the compressed all-reduce counts
    them), and the ratio to the float32 ring's."""
    sent = [r["push_bytes"] for r in workers if r.get("push_bytes")]
    if not sent or len(workers) < 2:
        return {}
    per_step = float(np.mean(sent)) / steps
    return {"push_bytes": per_step,
            "compression_ratio": _float32_bytes(0, len(workers), n_params) / per_step}


class Lead:
    """What the lead worker (rank S) does besides training: log, evaluate, show progress."""

    def __init__(self, job) -> None:
        s, roles = job.settings, job.roles
        self.job, self.s, self.n_workers = job, s, roles.n_workers
        self.log = MetricsLog(s.log, append=job.resume is not None and s.log is not None,
                              tensorboard=s.traces.tensorboard)
        self.x_test, self.y_test = job.reader.test_set()
        # batch-norm statistics for evaluation: recomputed from a seeded sample of the lead's rows
        job.model.set_calibration(job.reader.calibration_rows(CALIBRATION_SAMPLES)[0])
        if s.eval_samples:
            self.x_test, self.y_test = self.x_test[:s.eval_samples], self.y_test[:s.eval_samples]
        environment = psgd_variables(FLAG_VARIABLES)[0]   # what the lead read (flags win)
        self.log.write("config", **s.as_dict(), environment=environment, run_id=job.run_id,
                       n_workers=roles.n_workers,
                       n_servers=roles.n_servers, n_params=job.model.n_params,
                       total_steps=job.total_steps, start_step=job.start_step)
        self.bar = progress_bar(job.total_steps, job.start_step, enabled=not s.quiet)
        self.window = _Window()
        self.test_acc = float("nan")
        self.last_timers: dict = {}
        # --compress: each step record carries its compression ratio
        self.float32_bytes = (_float32_bytes(roles.n_servers, roles.n_workers, job.model.n_params)
                              if s.compression.compress != "none" and (roles.n_servers or roles.n_workers > 1)
                              else None)

    def after_steps(self, clock: int, losses, corrects, n: int, timers: dict, staleness,
                    consensus: float | None = None, mean=None, bound=None) -> None:
        """Count a run of steps ending at ``clock`` (their losses and correct counts, ``n``
        samples each; nothing is logged or evaluated between them); write a step record and
        evaluate when it is time.

        ``mean``: the workers' mean model, where each worker keeps its own (it is then
        evaluated, and this worker's own model beside it); ``consensus``: the mean
        squared distance of the workers' models from it; ``bound``: the staleness bound
        in force (``--staleness auto``).
        """
        s, step = self.s, clock + 1
        for loss, correct in zip(losses, corrects):
            self.window.add(float(loss), int(correct), n)
        if step % s.log_every == 0 or step == self.job.total_steps:
            self._log_step(clock, timers, staleness, consensus, bound)
        if self.evaluates_at(step):
            record = self._evaluate(mean)
            self.test_acc = record["test_accuracy"]
            self.log.write("eval", step=step, **record)
        self.bar.update(len(losses))

    def evaluates_at(self, step: int) -> bool:
        """Whether the model is evaluated after ``step`` (``--eval-every``; the last step's
        evaluation is the summary's)."""
        return bool(self.s.eval_every and step % self.s.eval_every == 0 and step != self.job.total_steps)

    def _evaluate(self, mean=None) -> dict:
        """Test loss and accuracy of the model, or of ``mean`` with this worker's own beside it."""
        model = self.job.model
        own_loss, own_acc = model.evaluate(self.x_test, self.y_test)
        if mean is None:
            return {"test_loss": own_loss, "test_accuracy": own_acc}
        own = model.params.copy()
        model.params[:] = mean
        try:
            test_loss, test_acc = model.evaluate(self.x_test, self.y_test)
        finally:
            model.params[:] = own
        return {"test_loss": test_loss, "test_accuracy": test_acc,
                "own_test_loss": own_loss, "own_test_accuracy": own_acc}

    def _log_step(self, clock: int, timers: dict, staleness, consensus: float | None,
                  bound=None) -> None:
        w, now = self.window, time.perf_counter()
        rate = w.samples / max(now - w.start, 1e-9)
        lr = self.job.config.lr_schedule(clock)
        deltas = {k: timers[k] - self.last_timers.get(k, 0.0) for k in timers}
        pushed = deltas.pop("push_bytes", None)
        pulled = deltas.pop("pull_bytes", None)
        ratio = ({"compression_ratio": self.float32_bytes * w.steps / pushed}
                 if self.float32_bytes and pushed else {})
        self.log.write("step", step=clock + 1, clock=clock, loss=w.loss / w.steps,
                       train_accuracy=w.correct / max(w.samples, 1), samples_per_s=rate,
                       est_global_samples_per_s=rate * self.n_workers, lr=lr,
                       staleness=staleness, **deltas,
                       **({"staleness_bound": bound} if self.job.config.staleness_auto else {}),
                       **({} if consensus is None else {"consensus_distance": consensus}),
                       **({} if pushed is None else {"push_bytes_per_step": pushed / w.steps}),
                       **ratio,
                       **({} if pulled is None else {"pull_bytes_per_step": pulled / w.steps}))
        postfix = {"loss": f"{w.loss / w.steps:.3f}"}
        if not math.isnan(self.test_acc):
            postfix["test_acc"] = f"{self.test_acc:.3f}"
        postfix["samples/s"] = f"{rate * self.n_workers:.0f}"
        self.bar.set_postfix(postfix, refresh=False)
        self.last_timers = dict(timers)
        w.reset(now)

    def summary(self, reports: list[dict], wall: float, skipped: int, mean=None,
                consensus: float | None = None) -> dict:
        """Evaluate the final parameters (``mean``: the workers' mean model, and this worker's
        own) and write the run's summary record."""
        job = self.job
        record = self._evaluate(mean)
        self.log.write("eval", step=job.end_step, **record)
        workers = [r for r in reports if r["role"] == "worker"]
        sent = [r["bytes_sent"] for r in workers if r.get("bytes_sent") is not None]
        steps = max(job.end_step - job.start_step, 1)
        decentralized = {} if mean is None else {
            "consensus_distance": consensus, "own_test_loss": record["own_test_loss"],
            "own_test_accuracy": record["own_test_accuracy"],
            "bytes_per_worker_step": float(np.mean(sent)) / steps if sent else None}
        servers = [r for r in reports if r["role"] == "server"]
        samples = sum(r["samples"] for r in workers)
        summary = self.log.write(
            "summary", steps=job.end_step, start_step=job.start_step, wall_s=wall,
            stopped=signal_name(job.stop.signum) if job.end_step < job.total_steps else None,
            samples=samples, samples_per_s=samples / max(wall, 1e-9),
            test_loss=record["test_loss"], test_accuracy=record["test_accuracy"],
            **decentralized,
            staleness_histogram=merge_histograms(reports),
            staleness_unit=job.protocol.staleness_unit,
            # the servers' (ssp, asp), else the workers' (hogwild)
            staleness_compensation=[r["compensation"] for r in reports if r.get("compensation")],
            # --staleness auto: each server's (version, bound) at the start and at every change
            staleness_bound=[r["bound_history"] for r in servers if r.get("bound_history")],
            worker_time={k: float(np.mean([r[k] for r in workers])) for k in TIMERS},
            workers=[{k: r[k] for k in ("rank", "steps", "wall_s", "compute_s", "straggle_s",
                                        "wait_s")} for r in workers],
            server_cpu_fraction=[r["cpu_s"] / r["wall_s"] if r["wall_s"] else 0.0
                                 for r in servers],
            window_pushes=sum(r["n_window_pushes"] for r in servers),
            **(_push_bytes(servers, job.model.n_params) if servers else
               _allreduce_bytes(workers, steps, job.model.n_params)),
            skipped_updates=sum(r["n_skipped"] for r in servers) + skipped)
        self.log.close()
        return summary

    def print_summary(self, summary: dict, wall: float, final_ckpt) -> None:
        """The run's closing lines on stdout."""
        s, job, roles = self.s, self.job, self.job.roles
        newest = None
        if s.checkpoint_dir:
            from psgd.run.checkpoint import list_checkpoints
            newest = final_ckpt or (list_checkpoints(s.checkpoint_dir, job.run_id) or [None])[-1]
        if summary["stopped"]:
            saved = f"checkpoint {newest}" if newest else "no checkpoint (no --checkpoint-dir)"
            print(f"psgd: stopped by {summary['stopped']} at step {job.end_step} of "
                  f"{job.total_steps} (test accuracy {summary['test_accuracy']:.4f}); {saved}; "
                  f"exit {EXIT_STOPPED}, resume with --resume auto", flush=True)
            return
        proto = job.protocol.label(job.config.staleness, job.config.staleness_auto)
        print(f"psgd: {s.model} with {proto}, {roles.n_servers} server(s) + {roles.n_workers} "
              f"worker(s): {job.end_step - job.start_step} steps in {wall:.1f} s, "
              f"{summary['samples_per_s']:.0f} samples/s; final test accuracy "
              f"{summary['test_accuracy']:.4f} (loss {summary['test_loss']:.4f})", flush=True)
        if s.compression.compress != "none" and "push_bytes" in summary:
            notes = [text for on, text in (
                (job.config.compression.feedback, "error feedback on"),
                (job.config.worker_momentum, "momentum on the workers (--momentum-correction)"),
                (job.config.momentum_gain, "momentum as its gain: plain SGD at lr / "
                                           "(1 - momentum) (--momentum-correction)"))
                if on]
            print(f"psgd: {s.compression.compress} pushes: "
                  f"{summary['push_bytes']:.0f} bytes each, "
                  f"{summary['compression_ratio']:.1f}x fewer than float32"
                  + "".join(f"; {text}" for text in notes), flush=True)
        if summary.get("consensus_distance") is not None:
            per_step = summary["bytes_per_worker_step"]
            print(f"psgd: that is the workers' mean model; worker 0's own: test accuracy "
                  f"{summary['own_test_accuracy']:.4f}; consensus distance "
                  f"{summary['consensus_distance']:.3g}"
                  + (f"; {per_step / 1e6:.3f} MB sent per worker per step" if per_step else ""),
                  flush=True)
        if s.log:
            print(f"psgd: log: {s.log}", flush=True)
        record, traces = s.recording.record, s.traces
        if record:
            print(f"psgd: record: {record} (replay with --replay {record})", flush=True)
        if traces.tensorboard:
            print(f"psgd: tensorboard: {traces.tensorboard} (tensorboard --logdir "
                  f"{traces.tensorboard})", flush=True)
        if traces.timeline:
            print(f"psgd: timeline: {traces.timeline} (open in ui.perfetto.dev)", flush=True)
        if s.checkpoint_dir:
            print(f"psgd: checkpoint: {newest}", flush=True)
