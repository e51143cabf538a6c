"""`psgd train --elastic`: the server job of an elastic run, from its port to its summary."""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

import numpy as np
from mpi4py import MPI

from psgd.elastic import leave, merged, tidy_shm
from psgd.elastic.alive import Beat, beat_path
from psgd.errors import UsageError
from psgd.elastic.links import Links
from psgd.elastic.outputs import evaluate, publish, save
from psgd.elastic.door import Door
from psgd.elastic.hello import of_run
from psgd.elastic.server import ElasticServer
from psgd.mpi import wait
from psgd.mpi.roles import Roles
from psgd.protocols import get
from psgd.run.job import agreed_run_id, announce, build_job
from psgd.run.metrics import MetricsLog
from psgd.run.run_plan import RunPlan
from psgd.run.settings import Resumed, resolve_run
from psgd.run.signals import EXIT_STOPPED, received, signal_name


def _settings(args: argparse.Namespace, comm: MPI.Comm) -> tuple[RunPlan, Resumed | None]:
    """The run's settings and the checkpoint it resumes from, refused with one line where the
    elastic run cannot take them."""
    settings, resumed = resolve_run(args)   # checks the elastic flags (psgd.run.mode_flags)
    if merged(get(settings.protocol)):
        return settings, resumed
    if comm.Get_size() != settings.servers:
        raise UsageError(f"--elastic: the server job is the servers only: start it with "
                         f"mpiexec -n S and --servers S (got {comm.Get_size()} rank(s), "
                         f"--servers {settings.servers}); workers join with `psgd join`")
    return settings, resumed


def _say(kind: str, fields: dict) -> str:
    w = fields.get("worker")
    if kind == "joined":
        return f"worker {w} joined at clock {fields['clock']} ({fields['updates']} updates so far)"
    if kind in ("left", "lost"):
        how = "finished" if kind == "left" else f"lost: {fields['why']}"
        return (f"worker {w} {how}; it pushed {fields['pushes']} times (clocks "
                f"{fields['first_clock']}..{fields['last_clock']})")
    if kind == "refused":
        return f"a joiner was refused: {fields['why']}"
    if kind == "backup":   # --replicas 2 (psgd.elastic.replica)
        return f"backup server {fields['why']} ({fields['updates']} updates so far)"
    return f"run over: {fields['why']}"


def serve_main(args: argparse.Namespace) -> None:
    """Entry point of ``psgd train --elastic`` (one rank): serve until the run's updates are
    applied, then evaluate, checkpoint and leave by :func:`psgd.elastic.leave` (a lost worker's
    requests stay pending, and MPI_Finalize would wait on them)."""
    comm = MPI.COMM_WORLD
    settings, resumed = _settings(args, comm)
    if merged(get(settings.protocol)):
        from psgd.elastic.ring_serve import ring_main
        return ring_main(args, settings, resumed)
    tidy_shm()   # what killed jobs left: this job leaves by os._exit, never MPI_Finalize
    wait.configure(stall_timeout=settings.stall_timeout, stall_abort=settings.stall_abort)
    # every rank checks the settings (the --log must not exist yet) before rank 0 writes it
    wait.wait(comm.Ibarrier(), "the other servers to check the settings")
    run_id = agreed_run_id(comm, resumed)
    rank, S = comm.Get_rank(), comm.Get_size()
    roles = Roles(comm=comm, rank=rank, size=S + 1, n_servers=S, n_workers=1, worker_comm=None)
    job = build_job(settings, roles, bool(getattr(args, "debug", False)), resumed, run_id)
    slots = settings.elastic.max_workers
    log = MetricsLog(None)
    if rank == 0:
        announce(job, resumed)   # --overwrite: another run's checkpoints go
        log = MetricsLog(settings.log, tensorboard=settings.traces.tensorboard)
        log.write("config", **settings.as_dict(), run_id=run_id, n_params=job.model.n_params, total_updates=job.total_steps)
    port = MPI.Open_port() if rank == 0 else None
    door = Door(comm, port, settings.elastic.port_file, settings.stall_timeout,
                run=of_run(settings))
    beat = None
    if rank == 0:
        door.close()   # what a killed run with this port file left (its beats, knocks)
        beat = Beat(beat_path(settings.elastic.port_file))   # the workers watch it while they wait
        publish(port, settings.elastic.port_file)
    t0 = time.perf_counter()
    server = _server(job, comm, slots, door, log, settings.elastic.no_worker_timeout)
    result = server.run()
    code = 0
    if rank == 0:
        beat.stop()
        door.close()
        code = _finish(job, server, result, log, time.perf_counter() - t0)
    # a server rank that left first would make mpiexec end rank 0 before its summary
    wait.wait(comm.Ibarrier(), "the other servers to finish")
    leave(code)


def _server(job, comm: MPI.Comm, slots: int, door: Door, log: MetricsLog,
            no_worker_s: float, cls=None, **extra) -> ElasticServer:
    """The server of ``job``'s shard, its events logged (and all but steps printed); ``cls``
    and ``extra``: a replica's (psgd.elastic.replica; by default the primary of --replicas 2)."""
    s = job.settings
    if cls is None and (s.elastic.replicas or 1) > 1:
        from psgd.elastic.replica import Primary
        cls, extra = Primary, {"backup_s": no_worker_s}
    S = comm.Get_size()
    roles = Roles(comm=Links(comm, slots, s.stall_timeout), rank=comm.Get_rank(),
                  size=S + slots, n_servers=S, n_workers=slots, worker_comm=None)
    welcome = {"settings": {**s.as_dict(), "data": os.path.abspath(s.data)},
               "run_id": job.run_id, "servers": S}

    def event(kind: str, **fields) -> None:
        log.write(kind, **fields)
        if kind != "step" and roles.rank == 0:
            print(f"psgd: {_say(kind, fields)}", flush=True)

    def snapshot(clock, params, opt_state):
        if getattr(server, "following", False):   # a backup writes once it took over
            return
        save(job, server.n_pushes, clock + 1, params, opt_state)

    resume = job.resume   # its step: the updates applied; its clocks: the servers' clock
    server = (cls or ElasticServer)(
        roles, job.shard_map, replace(job.config, push_window=False),
        init_shard=job.model.params.copy(),
        init_opt_state=resume.opt_state if resume and resume.optimizer == s.optimizer else None,
        on_snapshot=snapshot if s.checkpoint_dir else None,
        start_clock=int(resume.clocks.max()) if resume else 0,
        door=door, welcome=lambda w, clock: welcome, updates=job.total_steps,
        start_updates=resume.step if resume else 0, no_worker_s=no_worker_s, event=event,
        stopped=lambda: f"stopped by {signal_name(received())}" if received() else "",
        log_every=s.log_every, **extra)
    return server


def _finish(job, server: ElasticServer, result, log: MetricsLog, wall: float) -> int:
    """Evaluate the final parameters, write the summary and the last checkpoint; the exit code."""
    s = job.settings
    loss, acc = evaluate(job, result.params)
    ckpt = (save(job, server.n_pushes, server.version, result.params, result.opt_state)
            if s.checkpoint_dir else None)
    roster = server.roster()
    log.write("summary", updates=server.n_pushes, steps=result.n_updates,
              samples=server.n_pushes * s.batch_size,
              wall_s=wall, test_loss=loss, test_accuracy=acc, workers=roster,
              staleness_histogram=np.asarray(result.staleness_hist).tolist(),
              abandoned=server.abandoned, checkpoint=str(ckpt) if ckpt else None,
              **(server.replicas() if hasattr(server, "replicas") else {}))
    log.close()
    lost = sum(r["state"] == "lost" for r in roster)
    print(f"psgd: {s.model} with {s.protocol}, elastic: {server.n_pushes} updates from "
          f"{len(roster)} "
          f"worker(s), {lost} lost, in {wall:.1f} s; final test accuracy {acc:.4f} "
          f"(loss {loss:.4f})" + (f"; checkpoint: {ckpt}" if ckpt else ""), flush=True)
    if server.abandoned:
        print("psgd: error: the run ended early: no worker was connected for "
              f"{server.no_worker_s:g} s (--no-worker-timeout)", file=sys.stderr, flush=True)
        return 1
    return EXIT_STOPPED if received() else 0
