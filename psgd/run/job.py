"""The training job on every rank: set-up agreed by all ranks, the server or worker loop, the end."""
from __future__ import annotations

import argparse
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI

from psgd.config import ProtocolConfig
from psgd.errors import PsgdError
from psgd.mpi import wait
from psgd.mpi.roles import Roles, assign_roles, check_servers
from psgd.mpi.shardmap import ShardMap
from psgd.nn.optim import make_schedule
from psgd.protocols import Protocol, get
from psgd.run.checkpoint import Checkpoint, load_checkpoint, resolve_resume, save_checkpoint
from psgd.run.settings import TrainSettings, resolve


@dataclass
class Job:
    """Everything set up before training starts, identical in meaning on every rank."""

    settings: TrainSettings
    roles: Roles
    protocol: Protocol
    model: object
    shard_map: ShardMap | None
    config: ProtocolConfig
    total_steps: int
    start_step: int
    resume: Checkpoint | None
    debug: bool
    reader: object = None  # the worker's ShardReader (None on servers)

    def save_checkpoint(self, step: int, params: np.ndarray, opt_state: dict | None) -> Path:
        """Save the run's state at ``step`` (absolute) into ``--checkpoint-dir``."""
        s = self.settings
        ckpt = Checkpoint(params=np.asarray(params, dtype=np.float32), model_spec=s.model,
                          step=step, optimizer=s.optimizer, opt_state=dict(opt_state or {}),
                          clocks=np.asarray([step] * self.roles.n_workers),
                          protocol=s.protocol, seed=s.seed, config=s.as_dict())
        return save_checkpoint(s.checkpoint_dir, ckpt)


def agree(comm: MPI.Comm, fn, debug: bool):
    """Run ``fn`` on every rank; if it fails anywhere, rank 0 prints one line and all exit 1.

    Set-up errors are the same on every rank more often than not (a bad flag, a
    missing file); gathering them lets the job end with one clear message
    instead of N copies or an MPI_Abort.  ``fn`` must not call collectives.
    """
    try:
        result, message = fn(), None
    except (PsgdError, ValueError, OSError) as exc:
        if debug:
            traceback.print_exc()
        result, message = None, str(exc)
    messages = comm.allgather(message)  # pickled, once at set-up: not the training path
    failed = [(rank, m) for rank, m in enumerate(messages) if m is not None]
    if failed:
        if comm.Get_rank() == 0:
            rank, m = failed[0]
            same_everywhere = len(failed) == comm.Get_size() and all(x == m for _, x in failed)
            where = "" if same_everywhere or comm.Get_size() == 1 else f"rank {rank}: "
            print(f"psgd: error: {where}{m}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    return result


def _local_setup(args: argparse.Namespace, comm: MPI.Comm):
    settings = resolve(args)
    check_servers(settings.servers, comm.Get_size())
    return settings


def _build(settings: TrainSettings, roles: Roles, debug: bool) -> Job:
    from psgd.data.reader import ShardReader, dataset_info
    from psgd.nn.model import build_model

    info = dataset_info(settings.data)
    model = build_model(settings.model, seed=settings.seed)
    total = _total_steps(settings, info, model, roles.n_workers)
    protocol = get(settings.protocol)
    resume = _resume(settings, model, total, protocol)
    base = make_schedule(settings.lr_schedule, settings.lr, total, warmup=settings.warmup,
                         step_every=settings.lr_step_every, gamma=settings.lr_gamma)
    config = protocol.config(
        model.n_params, staleness=settings.staleness, overlap=settings.overlap,
        optimizer=settings.optimizer,
        opt_hparams={"momentum": settings.momentum, "weight_decay": settings.weight_decay},
        lr_schedule=base,  # clocks are the run's steps, also after a resume
        staleness_comp=settings.staleness_comp, comp_lambda=settings.comp_lambda,
        snapshot_every=settings.checkpoint_every,
        skip_nonfinite=settings.skip_nonfinite)
    shard_map = ShardMap(model.n_params, roles.n_servers) if roles.n_servers else None
    reader = None
    if roles.is_worker:  # loads (and checks) this worker's slice while errors are still agreed
        reader = ShardReader(settings.data, roles.worker_index, roles.n_workers,
                             settings.batch_size, seed=settings.seed)
    return Job(settings=settings, roles=roles, protocol=protocol, model=model,
               shard_map=shard_map, config=config, total_steps=total,
               start_step=resume.step if resume else 0, resume=resume, debug=debug,
               reader=reader)


def _total_steps(settings: TrainSettings, info: dict, model, n_workers: int) -> int:
    """The run's steps per worker, once the dataset is known to fit the model."""
    if tuple(info["input_shape"]) != tuple(model.input_shape) and \
            int(np.prod(info["input_shape"])) != int(np.prod(model.input_shape)):
        raise ValueError(f"model {settings.model} takes inputs of shape {tuple(model.input_shape)}, "
                         f"but {settings.data} holds {tuple(info['input_shape'])}")
    if info["n_classes"] != model.n_classes:
        raise ValueError(f"model {settings.model} has {model.n_classes} outputs, "
                         f"but {settings.data} has {info['n_classes']} classes")
    per_worker = info["train"]["n"] // n_workers  # the smallest slice
    steps_per_epoch = per_worker // settings.batch_size
    if steps_per_epoch < 1:
        raise ValueError(f"each of {n_workers} workers gets {per_worker} training samples, "
                         f"fewer than --batch-size {settings.batch_size}")
    if settings.steps is not None:
        return settings.steps
    return max(1, int(round((settings.epochs or 1.0) * steps_per_epoch)))


def _resume(settings: TrainSettings, model, total: int, protocol: Protocol) -> Checkpoint | None:
    """The checkpoint to resume from (its parameters loaded into ``model``), or None."""
    if not settings.resume:
        return None
    resume = load_checkpoint(resolve_resume(settings.resume))
    if resume.model_spec != settings.model:
        raise ValueError(f"checkpoint {settings.resume} is of model {resume.model_spec!r}, "
                         f"not --model {settings.model!r}")
    if resume.params.shape != model.params.shape:
        raise ValueError(f"checkpoint {settings.resume} holds {resume.params.size} parameters, "
                         f"model {settings.model} has {model.params.size}")
    if resume.optimizer != settings.optimizer and protocol.resumes_optimizer:
        raise ValueError(f"checkpoint {settings.resume} was trained with optimizer "
                         f"{resume.optimizer}; resume with --optimizer {resume.optimizer}")
    if resume.step >= total:
        raise ValueError(f"checkpoint {settings.resume} is at step {resume.step}, "
                         f"at or past the run's {total} steps")
    model.params[:] = resume.params
    return resume


def train_main(args: argparse.Namespace) -> None:
    """Entry point of ``psgd train`` on every rank."""
    comm = MPI.COMM_WORLD
    debug = bool(getattr(args, "debug", False))
    settings = agree(comm, lambda: _local_setup(args, comm), debug)
    wait.configure(stall_timeout=settings.stall_timeout, stall_abort=settings.stall_abort)
    roles = assign_roles(comm, settings.servers)
    job = agree(comm, lambda: _build(settings, roles, debug), debug)
    if roles.is_server:
        from psgd.run.server_rank import run_server
        run_server(job)
    else:
        from psgd.run.worker_rank import run_worker
        run_worker(job)
    wait.barrier(comm, "the other ranks to finish")
