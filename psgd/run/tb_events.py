"""TensorBoard event files (tensorboardX, no TensorFlow) from psgd's metrics records."""
from __future__ import annotations

import json
import os

# step-record field -> tag; each is a number when present
STEP_SCALARS = {"loss": "train/loss", "train_accuracy": "train/accuracy", "lr": "train/lr",
                "samples_per_s": "throughput/lead_samples_per_s",
                "est_global_samples_per_s": "throughput/samples_per_s",
                "staleness": "staleness/lead_worker", "staleness_bound": "staleness/bound",
                "consensus_distance": "gossip/consensus_distance",
                "compression_ratio": "compress/ratio",
                "push_bytes_per_step": "bytes/pushed_per_step",
                "pull_bytes_per_step": "bytes/pulled_per_step"}
EVAL_SCALARS = {"test_loss": "test/loss", "test_accuracy": "test/accuracy",
                "own_test_loss": "test/own_loss", "own_test_accuracy": "test/own_accuracy"}
SUMMARY_SCALARS = {"samples_per_s": "summary/samples_per_s", "wall_s": "summary/wall_s",
                   "test_accuracy": "summary/test_accuracy", "push_bytes": "summary/push_bytes",
                   "compression_ratio": "summary/compression_ratio",
                   "bytes_per_worker_step": "summary/bytes_per_worker_step",
                   "consensus_distance": "summary/consensus_distance"}
KINDS = ("config", "step", "eval", "summary")
INSTALL = "pip install 'psgd[tensorboard]' (tensorboardX)"


def check_dir(path: str | os.PathLike, flag: str = "--tensorboard") -> None:
    """Raise ValueError when ``path`` cannot hold event files or tensorboardX is missing."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a file; give a directory for the event files")
    try:
        import tensorboardX  # noqa: F401 (only whether it is installed)
    except ImportError:
        raise ValueError(f"{flag} needs tensorboardX: {INSTALL}") from None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _histogram(writer, tag: str, counts: list[int], step: int, walltime=None) -> None:
    """Counts of updates by staleness 0, 1, ... as one histogram (a bucket per integer)."""
    total = sum(counts)
    if not total:
        return
    values = [k for k, c in enumerate(counts) if c]
    writer.add_histogram_raw(tag, min=values[0], max=values[-1], num=total,
                             sum=sum(k * c for k, c in enumerate(counts)),
                             sum_squares=sum(k * k * c for k, c in enumerate(counts)),
                             bucket_limits=[k + 0.5 for k in range(len(counts))],
                             bucket_counts=list(counts), global_step=step, walltime=walltime)


class EventWriter:
    """Hand metrics records to a tensorboardX ``SummaryWriter`` writing into ``logdir``.

    Scalars per step record (loss, accuracy, lr, samples/s, staleness, consensus
    distance, compression ratio, bytes pushed and pulled, the time split), per
    evaluation (test loss and accuracy) and from the summary; staleness as
    histograms: the lead worker's steps so far at each step record, and every
    update of the run (all workers, from the summary) at the last step.
    """

    def __init__(self, logdir: str | os.PathLike, flush_secs: int = 10) -> None:
        check_dir(logdir)
        from tensorboardX import SummaryWriter
        self.writer = SummaryWriter(logdir=os.fspath(logdir), flush_secs=flush_secs)
        self.step = 0
        self.lead_staleness: list[int] = []

    def add(self, record: dict, walltime: float | None = None) -> None:
        """Write what ``record`` (a metrics record, see :mod:`psgd.run.metrics`) holds."""
        kind, w = record.get("kind"), self.writer
        self.step = int(record.get("step", self.step) or 0)
        table = {"step": STEP_SCALARS, "eval": EVAL_SCALARS, "summary": SUMMARY_SCALARS}
        for field, tag in table.get(kind, {}).items():
            if _number(record.get(field)):
                w.add_scalar(tag, record[field], self.step, walltime=walltime)
        if kind == "config":
            w.add_text("config", "\n".join(f"    {k} = {json.dumps(v)}"
                                           for k, v in record.items() if k != "kind"),
                       self.step, walltime=walltime)
        elif kind == "step":
            for field, value in record.items():   # the time split since the previous record
                if field.endswith("_s") and field not in STEP_SCALARS and _number(value):
                    w.add_scalar(f"time/{field[:-2]}", value, self.step, walltime=walltime)
            if _number(record.get("staleness")) and record["staleness"] >= 0:
                self.lead_staleness.append(int(record["staleness"]))
                counts = [0] * (max(self.lead_staleness) + 1)
                for s in self.lead_staleness:
                    counts[s] += 1
                _histogram(w, "staleness/lead_worker_steps", counts, self.step, walltime)
        elif kind == "summary":
            self.step = int(record.get("steps", self.step) or self.step)
            _histogram(w, "staleness/all_updates", record.get("staleness_histogram") or [],
                       self.step, walltime)

    def close(self) -> None:
        self.writer.close()
