"""`psgd join`: one worker of an elastic run, its own MPI job, connected to the servers' port.

The worker learns everything from the servers (settings, its slot, the clock it starts at),
pulls the current parameters, and pushes like any worker of the run's protocol until a pull
reply says the run is over. It reads the whole training set in an order of its own (seeded
by its slot), so a lost worker leaves no rows unread.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from psgd.elastic.hello import claims, connect_port, read_port, receive_welcome
from psgd.errors import UsageError

EXIT_DROPPED = 3   # the servers dropped this worker (it was silent too long) and told it

DESCRIPTION = """Join a running elastic run (psgd train --elastic) as one more worker.

Run it as its own MPI job, e.g. `mpiexec -n 1 psgd join --port-file run/port`, as often as
workers are wanted; each such job is one worker, and its loss does not stop the run. The
settings (model, data, optimizer) come from the servers; the data file's path must reach
the same file here (the servers send it as an absolute path)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port-file", required=True, metavar="PATH",
                        help="the file the server job wrote its port name to (--port-file)")
    parser.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                        help="how long to wait for the servers to admit this worker (default 60)")
    said = parser.add_argument_group(
        "what this worker is for", "checked by the servers before it is admitted: a worker "
        "whose model, protocol or data differ from the run's is refused with one line, and "
        "the run is not touched (not given: the run's own are taken)")
    said.add_argument("--model", metavar="SPEC", help="the model spec it trains")
    said.add_argument("--protocol", metavar="NAME", help="the protocol it expects")
    said.add_argument("--data", metavar="PATH",
                      help="its data file (the same bytes as the run's, on this node)")
    parser.add_argument("--backup", action="store_true",
                        help="join as the backup server of a run with --replicas 2 (before any "
                             "worker); it takes over if the server job is lost")


def _ring_transports(line: str, port_file: str) -> None:
    """Before MPI starts: take the ring's UCX transports (one the user set otherwise is
    refused), at the coordinator's node only (its beat names the node)."""
    from psgd.elastic.alive import PLACE, beat_path
    key, _, value = line.partition("=")
    if os.environ.get(key, value) != value:
        raise UsageError(f"the run at {port_file} is a ring that runs with {key}={value}, "
                         f"but {key}={os.environ[key]} is set here")
    os.environ[key] = value
    try:
        with open(beat_path(port_file), encoding="utf-8") as fh:
            place = fh.read().split()[0]
    except (OSError, IndexError):
        place = "unknown"
    if place != PLACE:
        raise UsageError(f"the run at {port_file} is a ring at one node ({place}), and this "
                         f"worker runs on {PLACE}")


def run(args: argparse.Namespace) -> None:
    if getattr(args, "backup", False):
        from psgd.elastic.replica_serve import backup_main
        return backup_main(args)
    port, transports = read_port(args.port_file)
    from psgd.elastic import leave, no_cross_memory_attach, tidy_shm
    if transports:
        _ring_transports(transports, args.port_file)
    no_cross_memory_attach()
    tidy_shm()
    from psgd.elastic.door import knock   # MPI starts here, after the transports are set
    knock(args.port_file, args.wait, said=claims(getattr(args, "model", None),
                                                 getattr(args, "data", None),
                                                 getattr(args, "protocol", None)))
    from psgd.mpi.phase import phase
    with phase("connecting to the servers"):
        inter = connect_port(port, args.wait, f"the servers at {args.port_file}")
    with phase("receiving the welcome"):
        welcome = receive_welcome(inter, args.wait)
    if welcome.get("ring"):
        from psgd.elastic.ring_join import member
        leave(member(inter, welcome, _job(inter, welcome, bool(getattr(args, "debug", False)))))
    from psgd.elastic.alive import Beat, beat_path
    beat = Beat(beat_path(args.port_file, welcome["slot"]))   # the servers watch it

    def end(code: int) -> None:
        beat.stop()
        leave(code)   # not MPI_Finalize: it could wait on the server job, which leaves so too

    from psgd.elastic.worker import ServersGone
    try:
        pushes, dropped = _train(inter, welcome, bool(getattr(args, "debug", False)),
                                 args.port_file, port, args.wait)
    except ServersGone as gone:   # the server job was killed, or ended while this one slept
        print(f"psgd: error: worker {welcome['slot']}: {gone} while this worker waited for "
              f"the servers; what it pushed since their last answer was not applied",
              file=sys.stderr, flush=True)
        end(1)
    if dropped:
        stall = welcome["settings"]["stall_timeout"]
        print(f"psgd: error: worker {welcome['slot']} was dropped by the servers after "
              f"{pushes} pushes: it sent nothing for longer than their --stall-timeout "
              f"({stall:g} s), and its pushes since were discarded; run `psgd join` again to "
              f"rejoin", file=sys.stderr, flush=True)
        end(EXIT_DROPPED)
    print(f"psgd: worker {welcome['slot']}: {pushes} pushes from clock {welcome['clock']}; the "
          f"servers ended the run", flush=True)
    end(0)


def _train(inter, welcome: dict, debug: bool, port_file: str, port: str,
           wait_s: float = 60.0) -> tuple[int, bool]:
    """Train as worker ``welcome['slot']`` until the servers say the run is over, or that they
    dropped it; its pushes, and whether it was dropped (:class:`ServersGone`: the servers'
    port file went while it waited)."""
    from psgd.elastic.worker import ElasticWorker, ServersGone
    from psgd.mpi import faults

    slot, clock = welcome["slot"], welcome["clock"]
    job = _job(inter, welcome, debug)
    settings, model, reader = job.settings, job.model, job.reader
    replicated = (settings.elastic.replicas or 1) > 1

    def connect(comm, port: str):
        return ElasticWorker(replace(job.roles, comm=comm), job.shard_map,
                             replace(job.config, push_window=False), port_file=port_file,
                             port=port, stall_timeout=settings.stall_timeout,
                             fault=faults.for_rank(0))

    worker = connect(inter, port)
    standby = None
    if replicated:   # its link to the backup server, made while every process lives
        from psgd.elastic.replica_join import link_standby
        standby = link_standby(port_file, slot)
    model.loss_and_grad(*reader.batch(clock))   # compiles the kernels before the first pull
    worker.start(model.params, clock)
    first = clock
    while not (worker.over or worker.dropped):
        if model.stochastic:
            model.reseed(slot, clock)
        x, y = reader.batch(clock)
        model.loss_and_grad(x, y)
        try:
            worker.step(model.params, model.grad, clock)
        except ServersGone as gone:   # --replicas 2: the backup took over (psgd.elastic.replica)
            if not replicated:
                raise
            from psgd.elastic.replica_join import forget, reroute
            forget(worker)
            inter, again, port = reroute(port_file, port, slot, wait_s, str(gone), standby)
            standby = None
            clock = again["clock"]
            worker = connect(inter, port)
            worker.start(model.params, clock)
            continue
        clock += 1
    if not worker.dropped:   # a dropped worker's done would reach no server
        worker.finish()
    return clock - first, worker.dropped


def _job(inter, welcome: dict, debug: bool):
    """This worker's job: the run's settings, reading the whole training set in an order of
    its slot's own (the servers write every file)."""
    from psgd.mpi import wait
    from psgd.mpi.roles import Roles
    from psgd.run.job import build_job
    from psgd.run.run_plan import RunPlan

    S, settings = welcome["servers"], RunPlan.from_flat(welcome["settings"])
    if not os.path.exists(settings.data):
        raise UsageError(f"the run's data {settings.data} is not on this node")
    wait.configure(stall_timeout=settings.stall_timeout, stall_abort=settings.stall_abort)
    # adpsgd's pairs check their graph over the run's workers; each still reads every row
    W = settings.elastic.max_workers if welcome.get("pairs") else 1
    roles = Roles(comm=inter, rank=S, size=S + W, n_servers=S, n_workers=W, worker_comm=None)
    mine = replace(settings, seed=settings.seed + 1 + welcome["slot"], checkpoint_dir=None,
                   log=None, traces=replace(settings.traces, tensorboard=None),
                   recording=replace(settings.recording, record=None))
    job = build_job(mine, roles, debug, None, welcome["run_id"])
    if W > 1:
        from psgd.data.reader import ShardReader
        job = replace(job, reader=ShardReader(mine.data, 0, 1, mine.batch_size, seed=mine.seed,
                                              augment=mine.augment))
    return job
