"""Helpers of the training benchmarks: the dataset, one ``psgd train`` run, emulated nodes."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from common import ROOT, dataset, mpiexec, run_bounded  # noqa: F401 (dataset: the scripts')


def grid_options(ap, args, **allowed) -> None:
    """Split the grid's comma lists in place: each option named in ``allowed`` (refusing a
    name not among its choices, with ``ap.error``), and ``workers`` and ``seeds`` as ints."""
    for key, names in allowed.items():
        values = getattr(args, key).split(",")
        bad = [v for v in values if v not in names]
        if bad:
            ap.error(f"unknown {key.rstrip('s')} {bad[0]!r}: {key} {', '.join(names)}")
        setattr(args, key, values)
    args.workers = [int(w) for w in args.workers.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]


def train(workers: int, flags: list, log: Path, timeout: float):
    """One ``mpiexec -n W+1 python -m psgd train --servers 1`` run logging to ``log``.

    Returns ``(process, records, seconds)``: the finished process, the log's
    records (empty when it wrote none) and the wall time from launch.
    """
    cmd = [mpiexec(), "-n", str(workers + 1), sys.executable, "-m",
           "psgd", "train", "--servers", "1", *map(str, flags), "--quiet", "--log", str(log)]
    t0 = time.perf_counter()
    proc = run_bounded(cmd, timeout, cwd=ROOT)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, records, time.perf_counter() - t0


def on_nodes(nodes: int, rate: str) -> list[str]:
    """The ``psgd net`` prefix that runs a command on ``nodes`` emulated nodes behind one link
    of ``rate`` (needs root)."""
    return [sys.executable, "-m", "psgd", "net", "--nodes", str(nodes), "--rate", rate, "--"]


def time_to_target(records: list[dict], target: float) -> float | None:
    """Seconds (the log's clock) to the first step record whose running training accuracy
    reaches ``target``; None when none does."""
    return next((r["time"] for r in records
                 if r["kind"] == "step" and r["train_accuracy"] >= target), None)


def error_line(proc) -> str:
    """The last line a failed run printed (a diverged run ends with one on stderr)."""
    return (proc.stderr.strip().splitlines() or ["no summary"])[-1][:200]


def mean_staleness(hist: list) -> float:
    """The mean of a staleness histogram (counts by staleness 0, 1, ...)."""
    return sum(i * c for i, c in enumerate(hist)) / max(sum(hist), 1)
