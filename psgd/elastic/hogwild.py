"""`psgd train --elastic --protocol hogwild`: hogwild over worker jobs merged into one
communicator with the coordinator (:mod:`psgd.elastic.ring_serve` admits them), one server.

The coordinator holds the parameter and counter windows (``MPI_Win_allocate``, made once over
the merged communicator before training); the members add to them one-sided. The run's
updates are tickets of the global counter: a member stops at its first ticket past the last,
so the survivors take a lost member's share. The coordinator watches the members' pids, logs
who was lost and when, and leaves without ``MPI_Win_free`` (collective over every member,
the dead included), as the ring leaves without ``MPI_Finalize``.
"""
from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

from psgd.elastic.alive import running
from psgd.elastic.outputs import evaluate
from psgd.elastic.ring import DONE, END
from psgd.errors import PsgdError
from psgd.hogwild.server import _publish, _read_final
from psgd.hogwild.windows import Windows
from psgd.mpi import faults, wait
from psgd.mpi.phase import rma_lock
from psgd.mpi.roles import Roles
from psgd.run.metrics import MetricsLog

CHECK_S = 0.01     # how often the coordinator reads its counters and the members' pids
PROGRESS_S = 5e-5  # its poll of MPI meanwhile: each member's accumulate waits on that progress
WATCH_S = 0.01  # a finished member's poll for the coordinator's END
LOSS_SPAN = 50  # a member reports its mean loss over its first and its last this many updates


def run_updates(settings, per_worker: int, workers: int) -> int:
    """The run's updates over all workers: --steps, else --epochs' worth of every worker's
    steps (``per_worker``, as a ring's member would take them)."""
    return settings.steps if settings.steps is not None else per_worker * workers


class HogwildCoordinator:
    """Rank 0 of the merged communicator: the one server. Construct it collectively with
    :func:`member` on every member (the windows, the first parameters); :meth:`run` then
    watches until every live member is done."""

    def __init__(self, comm: MPI.Intracomm, pids: list, job, log: MetricsLog, updates: int,
                 stall_s: float) -> None:
        W = comm.Get_size() - 1
        self.comm, self.pids, self.job, self.log = comm, pids, job, log
        self.updates, self.stall_s, self.members = updates, stall_s, list(range(1, W + 1))
        roles = Roles(comm=comm, rank=0, size=W + 1, n_servers=1, n_workers=W,
                      worker_comm=None)
        self.first_loss = evaluate(job, job.model.params)[0]
        self.windows = Windows(roles, job.shard_map, "allocate", tallies=True)
        with rma_lock:
            _publish(self.windows, job.model.params.astype(np.float32), 0)
        wait.barrier(comm, "the hogwild members to attach their windows")
        self.done: dict = {}   # member -> its report (updates applied, losses)
        self.lost: dict = {}   # member -> why, when, what it had applied
        self.count = 0         # the global counter when the run ended (tickets taken)
        self.t0, self.status = time.monotonic(), MPI.Status()

    def run(self) -> np.ndarray:
        """Watch until every live member is done; the final parameters (PsgdError: every
        member was lost)."""
        seen: dict = {}   # member -> (its tally, when it last moved)
        mark = 0          # the next tenth of the run's updates to log a step record at
        while True:
            self._hear()
            counters = self.windows.read_counters()
            now = time.monotonic()
            if counters[0] >= mark and mark < self.updates:
                self.log.write("step", updates=int(counters[0]), after_s=now - self.t0)
                mark = int(counters[0]) + max(1, self.updates // 10)
            for r in self.members:
                if r not in self.done and r not in self.lost and not running(self.pids[r]):
                    self._lose(r, counters, "its process ended")
            waiting = [r for r in self.members if r not in self.done and r not in self.lost]
            if not waiting:
                break
            for r in waiting:
                tally = int(counters[self.windows.tally_index(r - 1)])
                if seen.get(r, (None,))[0] != tally:
                    seen[r] = (tally, now)
                elif counters[0] >= self.updates and now - seen[r][1] > self.stall_s:
                    self._lose(r, counters, f"it added nothing for longer than --stall-timeout "
                                            f"{self.stall_s:g} s, and the run's updates are all "
                                            f"taken")
            self._progress(CHECK_S)
        if not self.done:
            raise PsgdError("every worker of the elastic hogwild run was lost")
        with rma_lock:
            final, self.count = _read_final(self.windows, 0)
        self.tallies = self.windows.read_counters()[1 + len(self.members):].tolist()
        for r in self.done:   # none leaves before: a finished member's pid shows it is not lost
            self.comm.send(None, dest=r, tag=END)
        return final

    def _progress(self, seconds: float) -> None:
        """Poll MPI for ``seconds`` (across jobs, the members' RMA completes only as this rank
        polls: the windows are not in one shared-memory domain)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.comm.Iprobe(MPI.ANY_SOURCE, DONE):
            time.sleep(PROGRESS_S)

    def _hear(self) -> None:
        while self.comm.Iprobe(MPI.ANY_SOURCE, DONE, self.status):
            source = self.status.Get_source()
            self.done[source] = self.comm.recv(source=source, tag=DONE)

    def _lose(self, r: int, counters: np.ndarray, why: str) -> None:
        tally = int(counters[self.windows.tally_index(r - 1)])
        after = time.monotonic() - self.t0
        self.lost[r] = {"why": why, "after_s": after, "at_update": int(counters[0]),
                        "applied": tally}
        self.log.write("lost", worker=r - 1, **self.lost[r])
        print(f"psgd: worker {r - 1} lost ({why}) after {after:.1f} s, at update "
              f"{int(counters[0])} of {self.updates}, having applied {tally}; the others take "
              f"its share", flush=True)

    def roster(self) -> list:
        """Each worker: its slot, state, updates applied (the counter window's tally), what it
        reported (done) or when and why it was lost."""
        out = []
        for r in self.members:
            entry = {"worker": r - 1, "state": "lost" if r in self.lost else "done",
                     "applied": int(self.tallies[r - 1])}
            entry.update(self.lost.get(r) or {"reported": self.done[r]})
            out.append(entry)
        return out

    def summary(self, params: np.ndarray, wall: float, ckpt) -> None:
        """The summary record and line: who was lost, when, and the final test loss."""
        job = self.job
        loss, acc = evaluate(job, params)
        roster = self.roster()
        self.log.write("summary", updates=self.updates, counter=self.count, wall_s=wall,
                       first_test_loss=self.first_loss, test_loss=loss, test_accuracy=acc,
                       workers=roster, checkpoint=str(ckpt) if ckpt else None)
        self.log.close()
        lost = [f"worker {w['worker']} after {w['after_s']:.1f} s (update {w['at_update']}, "
                f"{w['applied']} applied)" for w in roster if w["state"] == "lost"]
        print(f"psgd: {job.settings.model} with hogwild, elastic: {self.updates} updates, "
              f"{len(roster)} worker(s), lost: {', '.join(lost) or 'none'}, in {wall:.1f} s; "
              f"final test accuracy {acc:.4f} (loss {loss:.4f}, from {self.first_loss:.4f})"
              + (f"; checkpoint: {ckpt}" if ckpt else ""), flush=True)


def member(comm: MPI.Intracomm, welcome: dict, job) -> int:
    """Train as worker ``welcome['slot']`` until the run's updates are all taken; report to the
    coordinator and wait for its END (an ended pid is how it sees a loss). The exit code."""
    from psgd.hogwild.worker import HogwildWorker

    slot, W = welcome["slot"], comm.Get_size() - 1
    roles = Roles(comm=comm, rank=slot + 1, size=W + 1, n_servers=1, n_workers=W,
                  worker_comm=None)
    worker = HogwildWorker(roles, job.shard_map, job.config, "allocate", tallies=True)
    worker.limit = welcome["updates"]
    try:
        losses = _train(worker, job, slot, welcome["clocks"], welcome["updates"])
    except PsgdError as exc:
        print(f"psgd: error: worker {slot}: {exc}", file=sys.stderr, flush=True)
        return 1
    # no Unlock_all: every update was flushed, and with MPICH an Unlock_all can wait on a dead
    # member's lock_all (measured: the survivors never reached their report)
    comm.send({"updates": worker.stats["n_updates"], "skipped": worker.stats["skipped"],
               "first_loss": float(np.mean(losses[:LOSS_SPAN])) if losses else None,
               "last_loss": float(np.mean(losses[-LOSS_SPAN:])) if losses else None},
              dest=0, tag=DONE)
    end = comm.irecv(source=0, tag=END)
    while not end.Test():   # the coordinator's pid is watched meanwhile (ring_join)
        time.sleep(WATCH_S)
    print(f"psgd: worker {slot}: {worker.stats['n_updates']} updates applied; the run's "
          f"{welcome['updates']} are done", flush=True)
    return 0


def _train(worker, job, slot: int, clocks: int, updates: int) -> list:
    """Step until the worker's ticket is past the run's last update; its losses. The learning
    rate follows the run's progress (the global counter as last read) on the schedule's
    ``clocks``."""
    model, reader, config = job.model, job.reader, job.config
    params, fault, losses, clock = model.params, faults.for_rank(0), [], 0
    worker.start(params)
    if fault is not None:   # tests (PSGD_X_FAULT step=N): fires mid-accumulate of update N
        worker.posted = lambda: fault.at(clock)
    while not worker.over:
        x, y = reader.batch(clock)
        worker.before_batch(params, x)
        if model.stochastic:
            model.reseed(slot, clock)
        loss, _ = model.loss_and_grad(x, y)
        losses.append(float(loss))
        at = min(clocks - 1, worker.read_count * clocks // updates)
        worker.step(params, model.grad, clock, config.lr_schedule(at))
        clock += 1
    return losses
