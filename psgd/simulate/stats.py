"""What a simulation reports: throughput, staleness and delay distributions, utilisation."""
from __future__ import annotations

import numpy as np


def describe(hist) -> dict:
    """Mean, median, 99th percentile and max of a histogram (counts by value 0, 1, 2, ...)."""
    counts = np.asarray(hist, np.float64)
    total = counts.sum()
    if total == 0:
        return {"mean": 0.0, "p50": 0, "p99": 0, "max": 0, "histogram": []}
    values = np.arange(counts.size)
    cdf = np.cumsum(counts) / total
    return {"mean": float(values @ counts / total),
            "p50": int(np.searchsorted(cdf, 0.5)), "p99": int(np.searchsorted(cdf, 0.99)),
            "max": int(values[counts > 0].max()), "histogram": [int(c) for c in counts]}


def tv_distance(a, b) -> float:
    """Total-variation distance of two histograms, each normalised: half the L1 distance."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    n = max(a.size, b.size)
    a, b = np.pad(a, (0, n - a.size)), np.pad(b, (0, n - b.size))
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


def steady_rate(schedule) -> float:
    """Steps/s past each worker's first, a step ending with the reply to the pull behind its
    push (shard 0's), from the earliest first end to the latest last: as a real run's timeline
    is read, without its start-up (compilation, skew)."""
    from psgd.ps.order import REPLIED
    order, times = schedule.order, schedule.times
    mine = (order[:, 0] == 0) & (order[:, 1] == REPLIED) & (order[:, 3] >= 1)
    workers, at = order[mine, 2], times[mine]
    firsts = [at[workers == w][0] for w in np.unique(workers)]
    span = float(at[-1] - min(firsts)) if firsts else 0.0
    return (int(mine.sum()) - len(firsts)) / span if span > 0 else float("inf")


def summary(schedule) -> dict:
    """The JSON-ready summary of a :class:`psgd.simulate.events.Schedule`."""
    sec = schedule.seconds
    workers = schedule.worker_busy_s / sec if sec > 0 else schedule.worker_busy_s * 0
    servers = schedule.server_busy_s / sec if sec > 0 else schedule.server_busy_s * 0
    return {"simulated_s": sec, "updates": schedule.updates,
            "updates_per_s": schedule.updates / sec if sec > 0 else float("inf"),
            "steady_updates_per_s": steady_rate(schedule),
            "staleness": describe(schedule.staleness), "delay": describe(schedule.delay),
            "worker_utilisation": {"mean": float(workers.mean()), "min": float(workers.min()),
                                   "max": float(workers.max())},
            "server_utilisation": [float(u) for u in servers],
            "link_utilisation": schedule.link_utilisation}
