"""`psgd train --elastic --protocol allreduce` (or adpsgd): the coordinator of worker jobs
merged into one communicator.

It admits --max-workers W joiners one at a time, merging each into one communicator
(MPI_Intercomm_merge), sends them the initial parameters, and then only decides: a ring's new
members, clock to redo and who holds a finished sum (:mod:`psgd.elastic.ring`), or adpsgd's
live set (:mod:`psgd.elastic.pairs`). At the end it takes the members' parameters and writes
the summary.
"""
from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from psgd.elastic import RING_UCX_TLS, leave, tidy_shm
from psgd.elastic.alive import Beat, beat_path, running
from psgd.elastic.door import Door
from psgd.elastic.hello import of_run
from psgd.elastic.hogwild import HogwildCoordinator, run_updates
from psgd.elastic.pairs import PairsCoordinator, dump, dump_path
from psgd.elastic.outputs import evaluate, publish, save
from psgd.elastic.ring import DECIDE, DONE, END, REPORT
from psgd.elastic.server import TAG_WELCOME
from psgd.errors import PsgdError, UsageError
from psgd.mpi import wait
from psgd.mpi.roles import Roles
from psgd.protocols import get
from psgd.run.job import agreed_run_id, announce, build_job
from psgd.run.metrics import MetricsLog

LOOK_S = 0.005


def check_setup(comm: MPI.Comm, resumed, protocol: str = "allreduce") -> None:
    """UsageError where merged jobs cannot run: MPICH, one coordinator rank, shared-memory
    UCX."""
    if "MPICH" not in MPI.Get_library_version():
        raise UsageError(f"--elastic --protocol {protocol} runs under MPICH only (its survivors "
                         "were measured there, docs/design/elastic.md)")
    if comm.Get_size() != 1:
        raise UsageError(f"--elastic --protocol {protocol}: the coordinator is one rank: start "
                         f"it with mpiexec -n 1 (got {comm.Get_size()})")
    if os.environ.get("UCX_TLS") != RING_UCX_TLS:
        raise UsageError(f"--elastic --protocol {protocol} runs with UCX_TLS={RING_UCX_TLS} only "
                         f"(one node, shared memory: other lanes crash the survivors), not "
                         f"UCX_TLS={os.environ.get('UCX_TLS')}")
    if resumed is not None:
        raise UsageError(f"--elastic --protocol {protocol} does not resume a checkpoint yet")


def ring_main(args, settings, resumed) -> None:
    """The coordinator: admit the ring, decide on deaths, write the summary, leave."""
    comm = MPI.COMM_WORLD
    check_setup(comm, resumed, settings.protocol)
    tidy_shm()
    wait.configure(stall_timeout=settings.stall_timeout, stall_abort=settings.stall_abort)
    W, run_id = settings.elastic.max_workers, agreed_run_id(comm, resumed)
    roles = Roles(comm=comm, rank=0, size=W + 1, n_servers=1, n_workers=W, worker_comm=None)
    job = build_job(settings, roles, bool(getattr(args, "debug", False)), None, run_id)
    announce(job, None)
    log = MetricsLog(settings.log, tensorboard=settings.traces.tensorboard)
    log.write("config", **settings.as_dict(), run_id=run_id, n_params=job.model.n_params,
              total_updates=job.total_steps)
    port, port_file = MPI.Open_port(), settings.elastic.port_file
    door = Door(comm, port, port_file, settings.stall_timeout, run=of_run(settings))
    door.close()
    beat = Beat(beat_path(port_file))
    publish(port, port_file, f"UCX_TLS={RING_UCX_TLS}")
    pairs = get(settings.protocol).can("elastic-pairs")
    welcome = _welcome(settings, run_id, job, W)
    t0 = time.monotonic()
    segments, coordinator = [], None
    try:
        ring = _admit(door, welcome, W, settings.elastic.no_worker_timeout)
        with guard(settings.elastic.no_worker_timeout, "the workers did not all start",
                   door.close):
            ring.Bcast(job.model.params, root=0)
            segments = ring.gather([], root=0)   # each member's MPICH segment in /dev/shm
            if pairs:
                pids = ring.allgather(os.getpid())
                starts = np.empty((W + 1, job.model.n_params), np.float32)
                ring.Gather(job.model.params, starts, root=0)
                coordinator = PairsCoordinator(ring, pids, log)
            elif welcome["windows"]:   # hogwild: the windows, made over every member
                coordinator = HogwildCoordinator(ring, ring.allgather(os.getpid()), job, log,
                                                 welcome["updates"], settings.stall_timeout)
            else:
                coordinator = Coordinator(ring, job.total_steps, log)
        params = coordinator.run()
    except PsgdError as exc:
        print(f"psgd: error: {exc}", flush=True)
        beat.stop()
        door.close()
        _unlink_lost(segments, coordinator.pids if coordinator else [])
        leave(1)
    beat.stop()
    door.close()
    _unlink_lost(segments, coordinator.pids)
    log.write("segments", paths=[p for paths in segments[1:] for p in paths])   # the members'
    ckpt = save(job, job.total_steps, job.total_steps, params, None) if settings.checkpoint_dir \
        else None
    if pairs:
        if dump_path():
            dump(dump_path(), starts[1:], coordinator)
        _pairs_summary(job, coordinator, params, log, time.monotonic() - t0, ckpt)
    elif welcome["windows"]:
        coordinator.summary(params, time.monotonic() - t0, ckpt)
    else:
        _summary(job, coordinator, params, log, time.monotonic() - t0, ckpt)
    leave(0)


def _welcome(settings, run_id, job, W: int) -> dict:
    """What each joiner is told: the run's settings, its kind (ring, pairs, hogwild's windows)
    and length."""
    protocol = get(settings.protocol)
    pairs, windows = protocol.can("elastic-pairs"), protocol.can("elastic-windows")
    return {"settings": {**settings.as_dict(), "data": os.path.abspath(settings.data)},
            "run_id": run_id, "servers": 1, "clock": 0, "ring": True, "clocks": job.total_steps,
            "coordinator": os.getpid(), "pairs": pairs, "windows": windows,
            "updates": run_updates(settings, job.total_steps, W) if windows else None,
            "own_start": pairs and bool(dump_path())}


@contextmanager
def guard(seconds: float, what: str, close):
    """End the coordinator with one line (exit 1) if the body, which waits in MPI on joiners
    (a merge, a collective: nothing MPI can interrupt), takes over ``seconds``: a joiner that
    died meanwhile would keep it there for good. ``close`` removes the port file first (later
    joiners find no run); the members leave on seeing the coordinator gone."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(seconds):
            print(f"psgd: error: {what} within {seconds:g} s (one was killed while the ring "
                  f"formed?); the coordinator ends, and with it the run", flush=True)
            close()
            leave(1)
    threading.Thread(target=watch, daemon=True).start()
    try:
        yield
    finally:
        done.set()


def _unlink_lost(segments: list, pids: list) -> None:
    """Unlink the MPICH segments of the members whose process has ended (a SIGKILLed job's
    segment stays in /dev/shm otherwise: only MPI_Finalize removes it)."""
    for rank, paths in enumerate(segments or []):
        if rank and rank < len(pids) and not running(pids[rank]):
            for path in paths:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def _admit(door: Door, welcome: dict, W: int, wait_s: float) -> MPI.Intracomm:
    """Admit W joiners one at a time (knock, turn, accept), merging each into the ring."""
    comm, deadline = MPI.COMM_SELF, time.monotonic() + wait_s
    for k in range(W):
        ready = None
        while ready is None:
            if time.monotonic() > deadline:
                raise PsgdError(f"{k} of --max-workers {W} workers joined within "
                                f"--no-worker-timeout {wait_s:g} s; the ring never started")
            ready, _ = door.look()
            time.sleep(0.01)
        door.comm = comm   # the accept is collective over the ring so far
        inter = door.admit(ready)
        buf = np.frombuffer(json.dumps({**welcome, "slot": k}).encode(), np.uint8).copy()
        with guard(door.accept_s, f"worker {k} did not merge into the ring", door.close):
            inter.Send(buf, 0, TAG_WELCOME)
            comm = inter.Merge(high=False)
            comm.bcast(W - k - 1, root=0)   # the members take part in the next accept
        print(f"psgd: worker {k} joined ({k + 1} of {W})", flush=True)
    print(f"psgd: the ring of {W} workers starts", flush=True)
    return comm


class Coordinator:
    """Rank 0 of the ring: it hears reports and ends, and decides after each death."""

    def __init__(self, comm: MPI.Intracomm, clocks: int, log: MetricsLog) -> None:
        self.comm, self.clocks, self.log = comm, clocks, log
        self.pids = comm.allgather(os.getpid())
        self.ring, self.epoch = list(range(1, comm.Get_size())), 0
        self.reports: dict = {}   # member -> the clock it reported being in
        self.done: dict = {}      # member -> its final parameters
        self.lost: dict = {}      # member -> its last clock summed
        self.t0, self.status = time.monotonic(), MPI.Status()

    def run(self) -> np.ndarray:
        """Decide until every live member is done; their parameters (PsgdError: none left)."""
        while True:
            self._hear()
            live = [r for r in self.ring if running(self.pids[r])]
            if not live:
                raise PsgdError("every worker of the ring was lost")
            if set(live) <= set(self.done):
                break
            waiting = all(r in self.reports or r in self.done for r in live)
            if waiting and (self.reports or len(live) < len(self.ring)):
                self._decide(live)
            time.sleep(LOOK_S)
        for r in live:   # none leaves before: a finished member's pid shows it is not lost
            self.comm.send(None, dest=r, tag=END)
        self.ring = live
        return self.done[live[0]]

    def _hear(self) -> None:
        while self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, self.status):
            source, tag = self.status.Get_source(), self.status.Get_tag()
            msg = self.comm.recv(source=source, tag=tag)
            (self.reports if tag == REPORT else self.done if tag == DONE else {})[source] = msg

    def _decide(self, live: list) -> None:
        """The new ring ``live``; the clock to redo (the lowest reported), or the member that
        finished it, whose sum the ones behind take (a done member is past the last clock)."""
        at = {r: self.reports.get(r, self.clocks) for r in live}
        low = min(at.values())
        ahead = [r for r in live if at[r] > low]
        behind = [r for r in live if at[r] == low] if ahead else []
        self.epoch += 1
        for r in live:
            self.comm.send((self.epoch, live, low, ahead[0] if ahead else 0, behind),
                           dest=r, tag=DECIDE)
        for r in set(self.ring) - set(live):
            last = low if ahead else low - 1
            self.lost[r] = last
            self.log.write("lost", worker=r - 1, last_clock=last, why="its process ended",
                           after_s=time.monotonic() - self.t0,
                           sum_from=ahead[0] - 1 if ahead else None)
            print(f"psgd: worker {r - 1} lost (its process ended) after clock {last}; the "
                  f"ring goes on with {len(live)} worker(s) from clock {last + 1}", flush=True)
        self.ring, self.reports = live, {}

    def roster(self) -> list:
        """Each worker: its slot, state and the clocks its gradients were summed in."""
        return [{"worker": r - 1, "state": "lost" if r in self.lost else "done",
                 "first_clock": 0, "last_clock": self.lost.get(r, self.clocks - 1)}
                for r in range(1, self.comm.Get_size())]


def _summary(job, coordinator: Coordinator, params, log: MetricsLog, wall: float, ckpt) -> None:
    s = job.settings
    loss, acc = evaluate(job, params)
    roster = coordinator.roster()
    equal = all(np.array_equal(p, params) for p in coordinator.done.values())
    log.write("summary", steps=coordinator.clocks, wall_s=wall, test_loss=loss,
              test_accuracy=acc, workers=roster, replicas_equal=equal,
              checkpoint=str(ckpt) if ckpt else None)
    log.close()
    lost = [f"worker {w['worker']} after clock {w['last_clock']}" for w in roster
            if w["state"] == "lost"]
    print(f"psgd: {s.model} with allreduce, elastic ring: {coordinator.clocks} clocks, "
          f"{len(roster)} worker(s), lost: {', '.join(lost) or 'none'}, in {wall:.1f} s; "
          f"final test accuracy {acc:.4f} (loss {loss:.4f})"
          + (f"; checkpoint: {ckpt}" if ckpt else ""), flush=True)


def _pairs_summary(job, coordinator: PairsCoordinator, params, log: MetricsLog, wall: float,
                   ckpt) -> None:
    s = job.settings
    loss, acc = evaluate(job, params)
    roster = coordinator.roster()
    log.write("summary", steps=job.total_steps, wall_s=wall, test_loss=loss, test_accuracy=acc,
              workers=roster, epochs=coordinator.epoch, checkpoint=str(ckpt) if ckpt else None)
    log.close()
    lost = [f"worker {w['worker']} after {w['after_s']:.1f} s (last paired at clock "
            f"{w['last_pairing_clock']})" for w in roster if w["state"] == "lost"]
    print(f"psgd: {s.model} with adpsgd, elastic: {job.total_steps} clocks each, {len(roster)} "
          f"worker(s), lost: {', '.join(lost) or 'none'}, in {wall:.1f} s; final test accuracy "
          f"of the survivors' mean {acc:.4f} (loss {loss:.4f})"
          + (f"; checkpoint: {ckpt}" if ckpt else ""), flush=True)
