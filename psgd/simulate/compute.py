"""Each simulated worker's compute time per step: drawn from a measured distribution.

The samples come from a constant (``--compute-ms``), a real run's
``--timeline`` trace (its workers' ``compute`` spans) or JSON-lines log (each
worker's mean compute per step, from the summary), or a profile of the model
here (:func:`psgd.plan.command.measure_compute_s`). Heavy-tailed jitter
(``--jitter``) multiplies each draw by a mean-one factor; ``--straggler``
(the spec of `psgd train`, parsed by :mod:`psgd.run.straggler`) adds the
waits its workers would sleep.
"""
from __future__ import annotations

import json

import numpy as np

from psgd.run import straggler as straggler_spec

JITTER_FORMAT = "lognormal:SIGMA or pareto:ALPHA (ALPHA > 1)"


def samples_from_file(path: str) -> list[np.ndarray]:
    """Seconds each worker spends per step outside the protocol, from a psgd timeline (Chrome
    trace: the gaps between a worker's ``step`` spans, led by its median gap plus how much
    later than the first worker it started its first step, the ranks' clocks set to the
    server's (:mod:`psgd.simulate.clocks`); else its ``compute`` spans) or JSON-lines log
    (each worker's mean compute per step, from the summary); one float64 array per worker
    found.

    Raises
    ------
    ValueError
        One line: the file is unreadable, or neither of psgd's formats.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--compute-from {path}: cannot read ({exc})") from None
    try:
        trace = json.loads(text)
    except json.JSONDecodeError:
        trace = None
    if isinstance(trace, dict) and isinstance(trace.get("traceEvents"), list):
        found = _from_trace(trace["traceEvents"])
    else:
        found = [np.array([m]) for m in _from_log(text)]
    found = [f for f in found if f.size and (f > 0).all()]
    if not found:
        raise ValueError(f"--compute-from {path}: not a psgd profile (a `psgd train --timeline` "
                         f"trace with compute spans, or a `--log` with its summary)")
    return found


def latencies_from_file(path: str, span: str = "pull") -> np.ndarray:
    """Per-message latencies (seconds, float64) from a psgd timeline.

    ``span="pull"`` (a parameter-server run): half of each ``pull`` span past a
    worker's first (a pull span runs from the push handed over to the reply in
    hand: a round trip of two messages, each way's wait for a core included).
    ``span="step"`` (a gossip run): each ``step`` span past a worker's second (the
    wait for the neighbours' models, the mixing and the optimizer step: where
    MPI moves a message only while both ends poll, the exchange's own time; the
    first two steps wait on the neighbours' start-up).

    Raises
    ------
    ValueError
        One line: the file is unreadable, not a trace, or holds no such spans.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            events = json.load(fh)["traceEvents"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"--latency-from {path}: not a psgd timeline ({exc})") from None
    spans: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name") == span and e.get("dur", 0) > 0:
            spans.setdefault(e.get("pid"), []).append((e["ts"], e["dur"]))
    skip, scale = (1, 0.5e-6) if span == "pull" else (2, 1e-6)
    found = [d for v in spans.values() for _, d in sorted(v)[skip:]]
    if not found:
        run = "a parameter-server run's" if span == "pull" else "a gossip run's"
        raise ValueError(f"--latency-from {path}: no {span} spans ({run} --timeline)")
    return np.array(found, np.float64) * scale


def _from_trace(events: list) -> list[np.ndarray]:
    from psgd.simulate.clocks import worker_offsets
    shift = worker_offsets(events)   # a late start read on the server's clock
    spans: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name") in ("step", "compute") and e.get("dur", 0) > 0:
            spans.setdefault((e.get("pid"), e["name"]), []).append(
                (e["ts"] + shift.get(e.get("pid"), 0.0), e["dur"]))
    out = []
    firsts = [min(v)[0] for (_, name), v in spans.items() if name == "step" and len(v) > 2]
    for pid in sorted({pid for pid, _ in spans}, key=str):
        steps = sorted(spans.get((pid, "step"), []))
        if len(steps) > 2:   # the first step carries the worker's late start in the run
            gaps = [b[0] - a[0] - a[1] for a, b in zip(steps, steps[1:])]
            late = steps[0][0] - min(firsts)
            out.append(np.array([late + float(np.median(gaps))] + gaps) * 1e-6)
        elif (pid, "compute") in spans:
            out.append(np.array([d for _, d in spans[(pid, "compute")]]) * 1e-6)
    return out


def _from_log(text: str) -> list[float]:
    """Each worker's mean compute per step from a log's summary record (none: [])."""
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            return []
        if isinstance(record, dict) and record.get("kind") == "summary":
            return [w["compute_s"] / w["steps"] for w in record.get("workers", [])
                    if w.get("steps") and w.get("compute_s", 0) > 0]
    return []


def jitter_factors(spec: str | None, rng: np.random.Generator, shape) -> np.ndarray:
    """Mean-one multiplicative jitter of ``shape``; ones without a spec."""
    if not spec:
        return np.ones(shape)
    kind, _, value = spec.partition(":")
    try:
        x = float(value)
    except ValueError:
        x = float("nan")
    if kind == "lognormal" and x >= 0:
        return np.exp(x * rng.standard_normal(shape) - x * x / 2)
    if kind == "pareto" and x > 1:
        return (x - 1) / x * (1.0 + rng.pareto(x, shape))
    raise ValueError(f"--jitter {spec!r}: expected {JITTER_FORMAT}")


def compute_times(samples, workers: int, steps: int, seed: int = 0,
                  jitter: str | None = None, straggler: str | None = None) -> np.ndarray:
    """Seconds of each worker's compute at each step, float64 (workers, steps).

    ``samples``: seconds (array-like), or a list of one array per worker. With
    one array per worker each worker takes its own in order (cycled: a real
    run's bursts stay bursts), else draws with replacement from all of them
    pooled; times the jitter; plus what
    ``--straggler`` would make it wait after that compute (the same seeded
    pauses as a real run with this ``seed``: :func:`straggler_waits`).
    """
    per_worker = [np.asarray(s, np.float64).ravel() for s in
                  (samples if isinstance(samples, list) else [samples])]
    pooled = np.concatenate(per_worker)
    if pooled.size == 0 or not (pooled > 0).all() or not np.isfinite(pooled).all():
        raise ValueError("compute times must be finite and > 0 s")
    rng = np.random.default_rng([seed, 0x5137])
    if len(per_worker) == workers:   # each worker's own times, in their order (bursts kept)
        times = np.stack([np.resize(per_worker[w], steps) for w in range(workers)])
    else:
        times = pooled[rng.integers(0, pooled.size, (workers, steps))]
    times *= jitter_factors(jitter, rng, times.shape)
    return times + straggler_waits(times, seed, straggler)


def straggler_waits(times: np.ndarray, seed: int, straggler: str | None) -> np.ndarray:
    """Seconds each worker would sleep after each compute of ``times`` (W, T) under
    ``--straggler`` (the same seeded pauses as a real run with this ``seed``); zeros without."""
    W, T = times.shape
    waits = np.zeros((W, T))
    for w in range(W):
        slow = straggler_spec.for_worker(straggler, w, W)
        if slow.active:
            emulated = straggler_spec.Straggler(slow, seed, w, sleep=lambda _s: None)
            waits[w] = [emulated.after_compute(c, times[w, c]) for c in range(T)]
    return waits
