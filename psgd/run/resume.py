"""Resuming a run on every rank: the run id the ranks agree on, the checkpoint it resumes from
(checked against the settings), and another run's checkpoints in --checkpoint-dir."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from mpi4py import MPI

from psgd.mpi import wait
from psgd.protocols import Protocol
from psgd.run.checkpoint import AUTO, Checkpoint, foreign_checkpoints, load_checkpoint, new_run_id
from psgd.run.run_plan import RunPlan
from psgd.run.settings import Resumed

RUN_ID_BYTES = 32


def agreed_run_id(comm: MPI.Comm, resumed: Resumed | None) -> str:
    """The resumed run's id, or a new one made on rank 0: the same string on every rank."""
    buf = np.zeros(RUN_ID_BYTES, np.uint8)
    if comm.Get_rank() == 0:
        text = (resumed.run_id if resumed else new_run_id()).encode()[:RUN_ID_BYTES]
        buf[:len(text)] = np.frombuffer(text, np.uint8)
    wait.wait(comm.Ibcast(buf, root=0), "rank 0 to send the run id")
    return bytes(buf).rstrip(b"\0").decode()


def check_checkpoint_dir(settings: RunPlan, run_id: str) -> list[Path]:
    """Another run's checkpoints in --checkpoint-dir: refused, or (--overwrite) returned to remove."""
    if not settings.checkpoint_dir:
        return []
    foreign = foreign_checkpoints(settings.checkpoint_dir, run_id)
    if foreign and not settings.overwrite:
        d = settings.checkpoint_dir
        raise ValueError(f"--checkpoint-dir {d} holds another run's checkpoints (newest "
                         f"{foreign[-1].name}): continue that run with --resume {d}, replace "
                         f"them with --overwrite, or give another --checkpoint-dir")
    return foreign


def resume_checkpoint(settings: RunPlan, resumed: Resumed | None, model, total: int,
                      protocol: Protocol, load=load_checkpoint) -> Checkpoint | None:
    """The checkpoint to resume from (its parameters loaded into ``model``), or None;
    ``load(path)`` reads it (a part of its vectors, for a model that holds a part)."""
    if resumed is None:
        return None
    path = resumed.path
    resume = load(path)
    if resume.model_spec != settings.model:
        raise ValueError(f"checkpoint {path} is of model {resume.model_spec!r}, "
                         f"not --model {settings.model!r}")
    if resume.params.shape != model.params.shape:
        raise ValueError(f"checkpoint {path} holds {resume.params.size} parameters, "
                         f"model {settings.model} has {model.params.size}")
    if resume.optimizer != settings.optimizer and protocol.can("resume-optimizer"):
        raise ValueError(f"checkpoint {path} was trained with optimizer "
                         f"{resume.optimizer}; resume with --optimizer {resume.optimizer}")
    if resume.step >= total:
        raise ValueError(f"checkpoint {path} is at step {resume.step}, at or past the run's "
                         f"{total} steps: nothing left to train (give more --steps or --epochs"
                         f"{', or another --checkpoint-dir' if settings.resume == AUTO else ''})")
    model.params[:] = resume.params
    return resume


def announce(job, resumed: Resumed | None) -> None:
    """Rank 0: say what was resumed and changed, and remove another run's checkpoints (--overwrite).

    ``job`` is a :class:`psgd.run.job.Job` or any record with its ``settings``, ``run_id``
    and ``foreign`` (the list :func:`check_checkpoint_dir` returned)."""
    if job.foreign:  # listed again: a file this run has written since carries its id
        for path in foreign_checkpoints(job.settings.checkpoint_dir, job.run_id):
            path.unlink(missing_ok=True)
        print(f"psgd: --overwrite: removed {len(job.foreign)} checkpoint(s) of another run from "
              f"{job.settings.checkpoint_dir}", flush=True)
    if resumed is not None:
        changed = f"; changed: {', '.join(resumed.changed)}" if resumed.changed else ""
        print(f"psgd: resumed run {job.run_id or '(no id)'} from {resumed.path} at step "
              f"{resumed.step}{changed}", flush=True)
