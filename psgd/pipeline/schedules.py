"""The order of a stage's forward and backward microbatch ops (GPipe, 1F1B), and a bubble simulator."""
from __future__ import annotations

FORWARD, BACKWARD = "F", "B"
SCHEDULES = ("gpipe", "1f1b", "pipedream", "pipemare")
ASYNCHRONOUS = ("pipedream", "pipemare")   # a step after every microbatch, no flush


def stage_ops(schedule: str, stages: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s ops for one batch, in order: ``(FORWARD | BACKWARD, microbatch)``.

    ``gpipe``: every forward, then every backward.  ``1f1b`` (PipeDream-Flush):
    ``K - s - 1`` warm-up forwards, then one forward and one backward in turn, then
    the remaining backwards; the backwards run in the same (ascending) order, so
    the gradients accumulate as under gpipe.  ``pipedream`` and ``pipemare`` are 1F1B
    over all the run's microbatches at once (``microbatches`` is then their total): no flush.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    m = microbatches
    if schedule == "gpipe":
        return [(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)]
    warm = min(stages - stage - 1, m)
    ops = [(FORWARD, i) for i in range(warm)]
    for i in range(m - warm):
        ops += [(FORWARD, warm + i), (BACKWARD, i)]
    return ops + [(BACKWARD, i) for i in range(m - warm, m)]


def versions_behind(stages: int, stage: int) -> int:
    """Under ``pipedream``, microbatch g's forward on ``stage`` sees the weights after
    ``max(0, g - versions_behind)`` of its updates: its warm-up forwards."""
    return stages - stage - 1


def in_flight(schedule: str, stages: int, stage: int, microbatches: int) -> int:
    """The most microbatches whose forward ran and backward did not, at once, on ``stage``."""
    peak = live = 0
    for kind, _ in stage_ops(schedule, stages, stage, microbatches):
        live += 1 if kind == FORWARD else -1
        peak = max(peak, live)
    return peak


def recomputed(schedule: str, stages: int, stage: int, microbatches: int) -> int:
    """How many of ``stage``'s backwards re-run their forward when the layers keep only their
    last forward (``--recompute on``): those that do not follow their own forward at once."""
    ops = stage_ops(schedule, stages, stage, microbatches)
    return sum(kind == BACKWARD and (i == 0 or ops[i - 1] != (FORWARD, m))
               for i, (kind, m) in enumerate(ops))


def simulate(schedule: str, stages: int, microbatches: int, forward=1.0,
             backward=2.0) -> list[float]:
    """Each stage's idle fraction of the batch's span.

    ``forward``, ``backward``: one microbatch's op time, the same on every stage (a
    number) or per stage (a sequence).  Every op starts when its stage is free and its
    inputs exist: forward ``(s, m)`` after ``(s - 1, m)``'s forward, backward ``(s, m)``
    after ``(s + 1, m)``'s backward.  With equal times GPipe and 1F1B both give
    ``(K - 1) / (M + K - 1)`` on every stage.
    """
    fw = list(forward) if hasattr(forward, "__len__") else [forward] * stages
    bw = list(backward) if hasattr(backward, "__len__") else [backward] * stages
    orders = [stage_ops(schedule, stages, s, microbatches) for s in range(stages)]
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * stages
    nxt = [0] * stages
    while any(nxt[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            while nxt[s] < len(orders[s]):
                kind, m = orders[s][nxt[s]]
                dep = (FORWARD, s - 1, m) if kind == FORWARD else (BACKWARD, s + 1, m)
                if kind == FORWARD and s == 0 or kind == BACKWARD and s == stages - 1:
                    dep = (FORWARD, s, m) if kind == BACKWARD else None
                if dep is not None and dep not in done:
                    break
                start = max(free[s], done.get(dep, 0.0))
                free[s] = done[kind, s, m] = start + (fw[s] if kind == FORWARD else bw[s])
                nxt[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"schedule {schedule} deadlocks at K={stages}, M={microbatches}")
    span = max(free)
    return [1.0 - microbatches * (fw[s] + bw[s]) / span for s in range(stages)]


def predicted_bubble(stages: int, microbatches: int) -> float:
    """GPipe's bubble fraction ``(K - 1) / (M + K - 1)``."""
    return (stages - 1) / (microbatches + stages - 1)
