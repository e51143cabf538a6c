"""The training job on every rank: set-up agreed by all ranks, the server or worker loop, the end."""
from __future__ import annotations

import argparse
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI

from psgd.compress import gain
from psgd.config import ProtocolConfig
from psgd.env import ps_push_window, psgd_variables
from psgd.errors import PsgdError, set_traceback_base
from psgd.mpi import timeline, wait, watchdog
from psgd.mpi.phase import phase
from psgd.mpi.roles import Roles, assign_roles, check_servers
from psgd.mpi.shardmap import ShardMap
from psgd.nn.optim import make_schedule, optimal_t0
from psgd.protocols import Protocol, get
from psgd.protocols.momentum import plan as momentum_plan
from psgd.run.checkpoint import Checkpoint, save_checkpoint
from psgd.run.resume import agreed_run_id, announce, check_checkpoint_dir, resume_checkpoint
from psgd.run.run_plan import RunPlan
from psgd.run.settings import FLAG_VARIABLES, Resumed, resolve_run
from psgd.run.signals import EXIT_STOPPED, ignore, install
from psgd.run.stop import StopControl

MESSAGE_BYTES = 4096   # a set-up error message, as sent to rank 0
TAG_SETUP = 31003


@dataclass
class Job:
    """Everything set up before training starts, identical in meaning on every rank."""

    settings: RunPlan
    roles: Roles
    protocol: Protocol
    model: object
    shard_map: ShardMap | None
    config: ProtocolConfig
    total_steps: int
    start_step: int
    resume: Checkpoint | None
    debug: bool
    run_id: str = ""
    reader: object = None  # the worker's ShardReader (None on servers)
    stop: StopControl | None = None
    end_step: int = 0      # the step training ended at: total_steps, or where it was stopped
    foreign: list = None   # another run's checkpoints in --checkpoint-dir, replaced (--overwrite)
    straggler: object = None  # this worker's psgd.run.straggler.Straggler (None: not slowed)

    def save_checkpoint(self, step: int, params: np.ndarray, opt_state: dict | None) -> Path:
        """Save the run's state at ``step`` (absolute) into ``--checkpoint-dir``."""
        s = self.settings
        ckpt = Checkpoint(params=np.asarray(params, dtype=np.float32), model_spec=s.model,
                          step=step, optimizer=s.optimizer, opt_state=dict(opt_state or {}),
                          clocks=np.asarray([step] * self.roles.n_workers),
                          protocol=s.protocol, seed=s.seed, config=s.as_dict(),
                          run_id=self.run_id)
        return save_checkpoint(s.checkpoint_dir, ckpt, keep=s.checkpoint_keep)


def agree(comm: MPI.Comm, fn, debug: bool, doing: str, label: str):
    """Run ``fn`` on every rank; if it fails anywhere, rank 0 prints one line and all exit 1.

    Set-up errors are the same on every rank more often than not (a bad flag, a
    missing file); gathering them lets the job end with one clear message
    instead of N copies or an MPI_Abort.  ``fn`` must not call collectives.
    The outcomes meet on rank 0 by non-blocking messages, so a rank that never
    gets there is reported by name (``doing``: what the ranks are doing). The outcomes meet
    in phase ``label``.
    """
    try:
        result, message = fn(), None
    except (PsgdError, ValueError, OSError) as exc:
        if debug:
            traceback.print_exc()
        result, message = None, str(exc)
    with phase(label):
        messages = _gather_outcomes(comm, message, doing)
    failed = [(rank, m) for rank, m in enumerate(messages) if m is not None]
    if failed:
        if comm.Get_rank() == 0:
            rank, m = failed[0]
            same_everywhere = len(failed) == comm.Get_size() and all(x == m for _, x in failed)
            where = "" if same_everywhere or comm.Get_size() == 1 else f"rank {rank}: "
            print(f"psgd: error: {where}{m}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    return result


def _gather_outcomes(comm: MPI.Comm, message: str | None, doing: str) -> list:
    """Every rank's error message (None: it succeeded) on rank 0; elsewhere [None] or [failed]."""
    rank, size = comm.Get_rank(), comm.Get_size()
    rows = np.zeros((size if rank == 0 else 1, MESSAGE_BYTES), np.uint8)
    mine = rows[0]
    if message is not None:
        text = message.encode()[:MESSAGE_BYTES - 1]
        mine[0], mine[1:len(text) + 1] = 1, np.frombuffer(text, np.uint8)
    if rank == 0:
        reqs = [comm.Irecv(rows[r], source=r, tag=TAG_SETUP) for r in range(1, size)]
        wait.waitall(reqs, lambda: f"rank(s) {[r + 1 for r, q in enumerate(reqs) if q]} to {doing}")
        failed = np.array([rows[:, 0].any()], np.int64)
    else:
        wait.wait(comm.Isend(mine, dest=0, tag=TAG_SETUP),
                  f"rank 0 to hear that this rank could {doing}")
        failed = np.zeros(1, np.int64)
    wait.wait(comm.Ibcast(failed, root=0), f"rank 0 to hear from every rank that it could {doing}")
    if rank != 0:
        return [None] * size if not failed[0] else [None, "failed"]
    return [bytes(row[1:]).rstrip(b"\0").decode(errors="replace") if row[0] else None
            for row in rows]


def _local_setup(args: argparse.Namespace, comm: MPI.Comm):
    settings, resumed = resolve_run(args)
    # before the first wait on other ranks, so that it is reported as a stall too
    wait.configure(stall_timeout=settings.stall_timeout, stall_abort=settings.stall_abort)
    from psgd.run import tensor_rank
    if settings.split.wanted():
        tensor_rank.check(settings, comm.Get_size())
    else:
        check_servers(settings.servers, comm.Get_size())
    return settings, resumed


def build_job(settings: RunPlan, roles: Roles, debug: bool, resumed: Resumed | None,
              run_id: str) -> Job:
    from psgd.data.csr import CSRShardReader
    from psgd.data.reader import ShardReader, dataset_info

    info = dataset_info(settings.data)
    model = model_for_data(settings, info)
    total = total_steps(settings, info, model, roles.n_workers)
    protocol = get(settings.protocol)
    resume = resume_checkpoint(settings, resumed, model, total, protocol)
    foreign = check_checkpoint_dir(settings, run_id)
    base = lr_by_clock(settings, total, model)
    compression = settings.compression
    opt_hparams = {"momentum": settings.momentum, "weight_decay": settings.alpha
                   if settings.lr_schedule == "optimal" else settings.weight_decay}
    gain_feedback = gain.auto_feedback(compression.compress, compression.feedback,
                                       compression.compress_bucket)
    where = momentum_plan(protocol, compression.momentum_correction, optimizer=settings.optimizer,
                         momentum=settings.momentum, weight_decay=settings.weight_decay,
                         opt_hparams=opt_hparams, schedule=base, feedback=compression.feedback,
                         gain_feedback=gain_feedback,
                         staleness_comp=settings.compensation.staleness_comp)
    config = protocol.config(
        model.n_params, staleness=settings.staleness, staleness_max=settings.staleness_max,
        overlap=settings.overlap, optimizer=where.optimizer, opt_hparams=where.opt_hparams,
        lr_schedule=where.schedule,  # clocks are the run's steps, also after a resume
        snapshot_every=settings.checkpoint_every, skip_nonfinite=settings.skip_nonfinite,
        seed=settings.seed, topology=settings.topology, n_workers=roles.n_workers,
        worker_momentum=where.worker_momentum, momentum_gain=where.momentum_gain,
        replay_events=_replay_events(settings, roles, resume, total),
        push_window=ps_push_window(), **settings.for_halves())
    shard_map = ShardMap(model.n_params, roles.n_servers) if roles.n_servers else None
    # every rank checks the spec against the job's workers, so a bad one is one line
    slow = settings.stragglers.make(settings.seed, max(roles.worker_index, 0), roles.n_workers)
    reader = None
    if roles.is_worker:  # loads (and checks) this worker's slice while errors are still agreed
        if info.get("sparse"):
            reader = CSRShardReader(settings.data, roles.worker_index, roles.n_workers,
                                    settings.batch_size, seed=settings.seed)
        else:
            reader = ShardReader(settings.data, roles.worker_index, roles.n_workers,
                                 settings.batch_size, seed=settings.seed, augment=settings.augment)
    return Job(settings=settings, roles=roles, protocol=protocol, model=model,
               shard_map=shard_map, config=config, total_steps=total,
               start_step=resume.step if resume else 0, resume=resume, debug=debug,
               run_id=run_id, reader=reader, end_step=total, foreign=foreign,
               straggler=slow if roles.is_worker else None)


def lr_by_clock(settings: RunPlan, total: int, model):
    """The learning rate by clock; ``optimal``'s t0 from the model's loss (hinge for svm)."""
    loss = "hinge" if getattr(model, "kind", None) == "svm" else "log"
    t0 = optimal_t0(settings.alpha, loss) if settings.lr_schedule == "optimal" else None
    return make_schedule(settings.lr_schedule, settings.lr or 0.0, total, warmup=settings.warmup,
                         step_every=settings.lr_step_every, gamma=settings.lr_gamma,
                         alpha=settings.alpha or 0.0, t0=t0)


def model_for_data(settings: RunPlan, info: dict):
    """The model of --model, checked against the kind of data (sparse CSR or dense)."""
    from psgd.nn import sparse
    is_sparse = sparse.is_sparse_spec(settings.model)
    sparse.check_data_kind(settings.model, is_sparse, bool(info.get("sparse")), settings.data)
    if is_sparse:
        return sparse.build_sparse_model(settings.model, info["input_shape"][0], info["n_classes"])
    from psgd.nn.model import build_model
    return build_model(settings.model, seed=settings.seed, input_shape=info["input_shape"],
                       n_classes=info["n_classes"])


def _replay_events(settings: RunPlan, roles: Roles, resume, total: int) -> tuple | None:
    """--replay's events per shard, checked against this run on every rank (for one error)."""
    if not settings.recording.replay:
        return None
    from psgd.run.record import load_events
    events = load_events(settings.recording.replay, settings, roles.n_servers, roles.n_workers,
                         resume.step if resume else 0, total)
    return events if roles.is_server else None


def total_steps(settings: RunPlan, info: dict, model, n_workers: int) -> int:
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


def _notice_unknown_variables() -> None:
    """One line naming the ``PSGD_*`` variables psgd does not read (a typo, or a knob of
    another version), so none is ignored silently."""
    _, unknown = psgd_variables(FLAG_VARIABLES)
    if unknown:
        print(f"psgd: notice: ignoring {', '.join(unknown)}: not a psgd flag's variable or knob "
              f"(docs/guide/environment.md)", file=sys.stderr, flush=True)


def train_main(args: argparse.Namespace) -> None:
    """Entry point of ``psgd train`` on every rank."""
    install()
    comm = MPI.COMM_WORLD
    debug = bool(getattr(args, "debug", False))
    side, request = comm.Idup()   # the watchdog's own messages
    wait.wait(request, "the other ranks to start their stall watchdogs")
    dog = watchdog.start(side, wait.settings.stall_timeout, wait.settings.stall_abort)
    try:
        settings, resumed = agree(comm, lambda: _local_setup(args, comm), debug,
                                  "check the settings", "agreeing on the settings")
        dog.timeout, dog.abort = settings.stall_timeout, settings.stall_abort
        set_traceback_base(settings.log)
        if comm.Get_rank() == 0:
            _notice_unknown_variables()
        if settings.split.wanted():
            from psgd.run import tensor_rank
            from psgd.run.plan_job import network_flags
            job = tensor_rank.run(comm, settings, resumed, debug, agree, network_flags(args))
        else:
            job = _run(comm, settings, resumed, debug)
        with phase("finishing"):
            wait.barrier(comm, "the other ranks to finish")
            dog.stop()
    finally:
        dog.stop()
    ignore()
    if job.end_step < job.total_steps:
        raise SystemExit(EXIT_STOPPED)


def _run(comm: MPI.Comm, settings: RunPlan, resumed: Resumed | None, debug: bool) -> Job:
    """Set up the job (every blocking step a phase the watchdog times), run this rank's role."""
    with phase("agreeing on the run id"):
        run_id = agreed_run_id(comm, resumed)
    with phase("splitting into servers and workers"):
        wait.barrier(comm, "the other ranks to split into servers and workers")
        roles = assign_roles(comm, settings.servers)
    job = agree(comm, lambda: build_job(settings, roles, debug, resumed, run_id), debug,
                "read the data, build the model and load the checkpoint",
                "agreeing that every rank could build the job")
    if comm.Get_rank() == 0:
        announce(job, resumed)
    with phase("setting up the stop notices"):
        job.stop = StopControl(roles, job.start_step, job.config.staleness)
    if settings.traces.timeline:   # one zero for every rank's clock
        with phase("starting the timeline"):
            wait.barrier(comm, "the other ranks to start the timeline")
        timeline.start()
    if roles.is_server:
        from psgd.run.server_rank import run_server
        run_server(job)
    else:
        from psgd.run.worker_rank import run_worker
        run_worker(job)
    if settings.traces.timeline:
        from psgd.run.trace import save_timeline
        with phase("gathering the timeline"):
            save_timeline(job)
    from psgd.collectives.allreduce import free_all
    free_all()   # in a phase of its own, not at exit, where no watchdog runs
    return job
