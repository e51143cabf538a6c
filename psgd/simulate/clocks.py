"""The ranks' clocks in a parameter-server timeline, set to the server's by its pushes.

Each rank of a `psgd train --timeline` run takes its zero after a barrier; a
rank descheduled there starts its clock late, so spans of different ranks can
be milliseconds apart. A push cannot be applied before it was sent: matching
each worker's ``push`` spans (clock, staleness) to the server's ``apply`` spans
in the server's order, a worker's offset is the least of apply start less push
start, the fastest delivery (a few microseconds on one node).
"""
from __future__ import annotations

from collections import deque


def worker_offsets(events: list) -> dict:
    """Microseconds to add to each worker's timestamps (pid -> float) to read them on
    the clock of the first server's trace; {} when the trace has no server ``apply`` spans.
    A worker none of whose pushes could be matched keeps 0."""
    pushes: dict = {}
    applies = []
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") != "X" or "staleness" not in args:
            continue
        if e.get("name") == "push":
            pushes.setdefault(e.get("pid"), []).append((e["ts"], args["clock"], args["staleness"]))
        elif e.get("name") == "apply":
            applies.append((e.get("pid"), e["ts"], args["clock"], args["staleness"]))
    if not applies:
        return {}
    server = min(p for p, *_ in applies)
    queues = {p: deque(sorted(v)) for p, v in pushes.items()}
    best: dict = {}
    for pid, ts, clock, stale in sorted(a for a in applies if a[0] == server):
        ready = [p for p, q in queues.items() if q and q[0][1:] == (clock, stale)]
        if not ready:
            continue
        if len(ready) == 1:   # unambiguous: this worker's next push is the one applied
            best[ready[0]] = min(best.get(ready[0], float("inf")), ts - queues[ready[0]][0][0])
        queues[min(ready, key=lambda p: queues[p][0][0])].popleft()
    return {p: best.get(p, 0.0) for p in pushes}
