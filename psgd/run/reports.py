"""The end of a training run, shared by server and worker ranks: checkpoints and the final reports."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from psgd.mpi import wait
from psgd.run.checkpoint import Checkpoint, save_checkpoint

TAG_FINAL_PARAMS = 31001


def write_checkpoint(job, step: int, params: np.ndarray, opt_state: dict | None,
                     clocks=None) -> Path:
    """Save the run's state at ``step`` (absolute) into ``--checkpoint-dir``."""
    s = job.settings
    ckpt = Checkpoint(params=np.asarray(params, dtype=np.float32), model_spec=s.model, step=step,
                      optimizer=s.optimizer, opt_state=dict(opt_state or {}),
                      clocks=np.asarray(clocks if clocks is not None else [step] * job.roles.n_workers),
                      protocol=s.protocol, seed=s.seed, config=s.as_dict())
    return save_checkpoint(s.checkpoint_dir, ckpt)


def gather_reports(job, report: dict) -> list[dict] | None:
    """Collect every rank's end-of-run report on the lead worker (off the training path)."""
    comm = job.roles.comm
    wait.barrier(comm, "every rank to finish training")
    return comm.gather(report, root=job.roles.lead_worker)


def merge_histograms(reports: list[dict]) -> list[int]:
    """Sum the staleness histograms found in ``reports``."""
    total: np.ndarray = np.zeros(0, np.int64)
    for report in reports:
        hist = np.asarray(report.get("staleness_histogram") or [], dtype=np.int64)
        if hist.size > total.size:
            total = np.pad(total, (0, hist.size - total.size))
        total[:hist.size] += hist
    return total.tolist()
