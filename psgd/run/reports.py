"""The end of a training run, shared by server and worker ranks: every rank's report to the lead."""
from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from psgd.mpi import wait
from psgd.mpi.report import StalenessHistogram

TAG_FINAL_PARAMS = 31001
TAG_REPORT = 31004


def gather_reports(job, report: dict) -> list[dict] | None:
    """Collect every rank's end-of-run report on the lead worker (off the training path).

    By messages waited on without blocking, so a rank that never sends its
    report is named; returns the reports by rank on the lead, None elsewhere.
    """
    comm, lead = job.roles.comm, job.roles.lead_worker
    if comm.Get_rank() != lead:
        data = np.frombuffer(json.dumps(report, default=_plain).encode(), np.uint8)
        wait.wait(comm.Isend(data, dest=lead, tag=TAG_REPORT),
                  f"worker rank {lead} to take this rank's end-of-run report")
        return None
    reports, status = [], MPI.Status()
    for rank in range(comm.Get_size()):
        if rank == lead:
            reports.append(report)
            continue
        wait.probe(comm, rank, TAG_REPORT, status, f"rank {rank} to send its end-of-run report")
        data = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        comm.Recv(data, source=rank, tag=TAG_REPORT)
        reports.append(json.loads(data.tobytes()))
    return reports


def _plain(value):
    """A numpy scalar or array as the Python numbers JSON takes."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"an end-of-run report holds a {type(value).__name__}, which JSON cannot")


def merge_histograms(reports: list[dict]) -> list[int]:
    """Sum the staleness histograms found in ``reports``."""
    found = [r["staleness_histogram"] for r in reports if r.get("staleness_histogram")]
    total = StalenessHistogram()
    for counts in found:
        total.merge(counts)
    return total.counts.tolist() if found else []
