"""`--timeline FILE`: every rank's spans, gathered on the lead and written as Chrome trace JSON.

The file opens in Perfetto (ui.perfetto.dev) and chrome://tracing: one
process per rank, a ``loop`` row whose spans tile the rank's training time
and a ``protocol`` row with a worker's push, wait, pull or all-reduce inside
its ``step`` spans. Times are microseconds from the barrier before training.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from mpi4py import MPI

from psgd.atomic_file import atomic_output
from psgd.mpi import timeline, wait

TAG_TIMELINE = 31006
ROWS = ("loop", "protocol")


def save_timeline(job) -> Path | None:
    """Every rank: send its spans to the lead worker, which writes ``--timeline``'s file."""
    tl = timeline.stop()
    roles, comm = job.roles, job.roles.comm
    mine = tl.packed()
    lead = roles.lead_worker
    if roles.rank != lead:
        wait.wait(comm.Isend(mine, dest=lead, tag=TAG_TIMELINE),
                  f"worker rank {lead} to take this rank's timeline")
        return None
    status, ranks = MPI.Status(), []
    for rank in range(comm.Get_size()):
        if rank == lead:
            ranks.append(mine)
            continue
        wait.probe(comm, rank, TAG_TIMELINE, status, f"rank {rank} to send its timeline")
        buf = np.empty(status.Get_count(MPI.BYTE) // 8, np.float64)
        comm.Recv(buf, source=rank, tag=TAG_TIMELINE)
        ranks.append(buf.reshape(-1, 5))
    path = Path(job.settings.traces.timeline)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(trace_events(ranks, roles.n_servers)))
    return path


def trace_events(ranks: list[np.ndarray], n_servers: int) -> dict:
    """The Chrome trace of every rank's packed spans (:meth:`Timeline.packed`), rank = pid."""
    events, dropped = [], {}
    for rank, packed in enumerate(ranks):
        n, lost = int(packed[0, 0]), int(packed[0, 1])
        role = f"server {rank}" if rank < n_servers else f"worker {rank - n_servers}"
        events.append({"name": "process_name", "ph": "M", "pid": rank,
                       "args": {"name": f"rank {rank} ({role})"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank,
                       "args": {"sort_index": rank}})
        for tid, row in enumerate(ROWS):
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                           "args": {"name": row}})
        if lost:
            dropped[rank] = lost
        for kind, t0, t1, clock, staleness in packed[1:n + 1]:
            name = timeline.KINDS[int(kind)]
            args = {}
            if clock >= 0:
                args["clock"] = int(clock)
            if staleness >= 0:
                args["staleness"] = int(staleness)
            events.append({"name": name, "cat": role.split()[0], "ph": "X", "pid": rank,
                           "tid": timeline.ROW.get(name, 0), "ts": round(t0 * 1e6, 3),
                           "dur": round((t1 - t0) * 1e6, 3), "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "psgd", "max_spans_per_rank": timeline.MAX_SPANS,
                          "dropped_spans": dropped,
                          "wall_s": {r: float(p[0, 2]) for r, p in enumerate(ranks)}}}
