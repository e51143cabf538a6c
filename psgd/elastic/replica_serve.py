"""`psgd join --backup`: the backup server of an elastic run with ``--replicas 2``.

It joins the server job like a worker (before any worker), takes the run's settings from its
welcome, follows the primary's forwarded updates (:mod:`psgd.elastic.replica`), and, when the
primary's process is gone, publishes a port of its own in the port file and serves the rest of
the run: the summary and checkpoint are then its own, with the lost server in them.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from psgd.errors import UsageError


def _append_log(path: str | None):
    """The run's log, opened to append after the primary's last whole line."""
    from psgd.run.metrics import MetricsLog
    if path and os.path.exists(path):
        with open(path, "rb+") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell():
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":   # the primary died mid-line
                    fh.write(b"\n")
    return MetricsLog(path, append=True)


def backup_main(args: argparse.Namespace) -> None:
    """Entry point of ``psgd join --backup`` (one rank)."""
    from psgd.elastic import leave, no_cross_memory_attach, tidy_shm
    from psgd.elastic.hello import connect_port, of_run, read_port, receive_welcome
    port, _ = read_port(args.port_file)
    no_cross_memory_attach()
    tidy_shm()
    from mpi4py import MPI

    from psgd.elastic.alive import Beat, beat_path
    from psgd.elastic.door import Door, knock
    from psgd.elastic.replica import BACKUP, BACKUP_BEAT, Backup
    from psgd.elastic.serve import _server
    from psgd.mpi import wait
    from psgd.mpi.roles import Roles
    from psgd.run.job import build_job
    from psgd.run.metrics import MetricsLog
    from psgd.run.run_plan import RunPlan

    comm = MPI.COMM_WORLD
    if comm.Get_size() != 1:
        raise UsageError("psgd join --backup runs as one rank (mpiexec -n 1)")
    knock(args.port_file, args.wait, kind=BACKUP)
    link = connect_port(port, args.wait, f"the primary server at {args.port_file}")
    welcome = receive_welcome(link, args.wait)
    if not welcome.get("backup"):   # the servers took it for a worker; they drop it when silent
        raise UsageError(f"the run at {args.port_file} was not started with --replicas 2: it "
                         f"takes no backup server")
    settings = RunPlan.from_flat(welcome["settings"])
    standby = _standby_door(comm, args.port_file, settings.stall_timeout)   # workers come now
    wait.configure(stall_timeout=settings.stall_timeout, stall_abort=settings.stall_abort)
    roles = Roles(comm=comm, rank=0, size=2, n_servers=1, n_workers=1, worker_comm=None)
    job = build_job(settings, roles, bool(getattr(args, "debug", False)), None,
                    welcome["run_id"])
    beat = Beat(beat_path(args.port_file, BACKUP_BEAT))   # the primary watches it
    door = Door(comm, None, args.port_file, settings.stall_timeout, run=of_run(settings))
    server = _server(job, comm, settings.elastic.max_workers, door, MetricsLog(None),
                     settings.elastic.no_worker_timeout, cls=Backup, link=link,
                     standby=standby)
    print(f"psgd: backup server of run {welcome['run_id']} joined; following the primary",
          flush=True)
    t0 = time.perf_counter()
    why = server.follow(t0)
    beat.stop()
    if not why:
        standby.close()
        print("psgd: backup: the primary ended the run; the backup leaves", flush=True)
        leave(0)
    _take_over(server, job, door, settings, args.port_file, why, t0)


def _standby_door(comm, port_file: str, accept_s: float):
    """The backup's own door, at ``port_file + STANDBY``: each worker links to the backup
    through it when it joins (psgd.elastic.replica_join.link_standby)."""
    from mpi4py import MPI

    from psgd.elastic.door import Door
    from psgd.elastic.outputs import publish
    from psgd.elastic.replica import STANDBY
    path = port_file + STANDBY
    door = Door(comm, MPI.Open_port(), path, accept_s)
    door.stand_in = True   # a worker that dies while it is accepted is let go, not fatal
    publish(door.port, path, say=False)
    return door


def _take_over(server, job, door, settings, port_file: str, why: str, t0: float) -> None:
    """The primary is lost (``why``): log it, open a port of our own, publish it, serve the
    rest of the run and leave with its outcome."""
    from mpi4py import MPI

    from psgd.elastic import leave
    from psgd.elastic.alive import Beat, beat_path
    from psgd.elastic.outputs import publish
    from psgd.elastic.serve import _finish, _say
    lost = server.lost_record[-1]
    print(f"psgd: server primary lost after {lost['updates']} updates, {lost['at_s']:.1f} s "
          f"into the run ({why}); the backup takes over (the primary's MPICH segments removed: "
          f"{len(lost['segments'])})", file=sys.stderr, flush=True)
    log = _append_log(settings.log)
    log.write("server_lost", **lost)

    def event(kind: str, **fields) -> None:
        log.write(kind, **fields)
        if kind == "rerouted":
            print(f"psgd: worker {fields['worker']} re-routed to the backup at clock "
                  f"{fields['clock']}", flush=True)
        elif kind != "step":
            print(f"psgd: {_say(kind, fields)}", flush=True)

    server.event = event
    new_port = MPI.Open_port()
    server.take_over(new_port)
    servers_beat = Beat(beat_path(port_file))   # the workers watch it, as the primary's
    publish(new_port, port_file)
    result = server.run()
    servers_beat.stop()
    door.close()
    leave(_finish(job, server, result, log, time.perf_counter() - t0))
