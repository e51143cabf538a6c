"""The end of a training run, shared by server and worker ranks: every rank's report to the lead."""
from __future__ import annotations

from psgd.mpi import wait
from psgd.mpi.report import StalenessHistogram

TAG_FINAL_PARAMS = 31001


def gather_reports(job, report: dict) -> list[dict] | None:
    """Collect every rank's end-of-run report on the lead worker (off the training path)."""
    comm = job.roles.comm
    wait.barrier(comm, "every rank to finish training")
    return comm.gather(report, root=job.roles.lead_worker)


def merge_histograms(reports: list[dict]) -> list[int]:
    """Sum the staleness histograms found in ``reports``."""
    total = StalenessHistogram()
    for report in reports:
        total.merge(report.get("staleness_histogram") or [])
    return total.counts.tolist() if any(r.get("staleness_histogram") for r in reports) else []
