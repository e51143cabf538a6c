"""Stopping a run early: SIGTERM, SIGUSR1 or SIGINT on any rank stops every worker.

A signalled rank sends a notice to every worker. Under a finite staleness
bound (bsp, ssp, allreduce) every worker stops at one clock: every ``every``
clocks the workers start a non-blocking all-reduce (MAX) of what they have
heard and of their time per clock, and complete it ``every`` clocks later;
when it says stop, all stop there. ``every`` follows the slowest worker's time
per clock (about CHECK_S of training, bound + 1 to DEFAULT_EVERY clocks)
unless PSGD_X_STOP_EVERY fixes it. Its wait is for workers that are behind, like
the protocols' own waits, so the two never wait on each other in a cycle.
Without a bound (asp, hogwild) nothing waits: each worker stops at its next
clock, and the run ends at the slowest worker's clock.
"""
from __future__ import annotations

import math
import time

import numpy as np
from mpi4py import MPI

from psgd.env import env_int
from psgd.errors import UsageError
from psgd.mpi import wait
from psgd.run.signals import received, set_notify

TAG_NOTICE = 31002
DEFAULT_EVERY = 32  # the most clocks between stop checks (PSGD_X_STOP_EVERY=N: always N)
CHECK_S = 0.5       # the training time between stop checks the cadence aims at


def _dup(comm: MPI.Comm, what: str) -> MPI.Comm:
    new, request = comm.Idup()
    wait.wait(request, what)
    return new


class StopControl:
    """This rank's part in agreeing on a stop (collective over the job to create).

    Workers call :meth:`check` at every clock and stop when it is True; then
    every rank calls :meth:`close` and :meth:`share_end`.
    """

    def __init__(self, roles, start_clock: int, bound: float, every: int | None = None) -> None:
        fixed = every or env_int("PSGD_X_STOP_EVERY", 0)   # 0: follow the time per clock
        if fixed < 0:
            raise UsageError(f"PSGD_X_STOP_EVERY must be >= 0 (0: adaptive), got {fixed}")
        # a check more often than the bound would bound the workers' spread tighter
        self.least = int(bound) + 1 if math.isfinite(bound) else 0
        self.most = max(fixed or DEFAULT_EVERY, self.least)
        self.fixed = bool(fixed)
        self.every = (self.most if fixed else self.least) if self.least else 0
        self.next_check, self.timer = start_clock, (time.perf_counter(), start_clock)
        self.roles = roles
        self.comm = _dup(roles.comm, "the other ranks to set up the stop notices")
        self.sent: list = []
        self.heard = 0
        self.signum = 0      # the agreed stop's signal (0: no stop)
        self.round = None    # (request, clock) of the stop check in flight
        self.mine, self.result = np.zeros(2, np.int64), np.zeros(2, np.int64)   # signal, us/clock
        self.serve = None    # run while a stop check waits (a worker others wait on answers)
        if roles.is_worker:
            self.workers = _dup(roles.worker_comm, "the other workers to set up the stop checks")
            self.notice = np.zeros(1, np.int64)
            self.listen = self.comm.Irecv(self.notice, MPI.ANY_SOURCE, TAG_NOTICE)
        set_notify(self._notify)

    def _notify(self) -> None:
        """Tell every worker that this rank was signalled (from the signal handler)."""
        roles = self.roles
        for k in range(roles.n_workers):
            if roles.worker_rank(k) != roles.rank:
                buf = np.array([received()], np.int64)
                self.sent.append((buf, self.comm.Isend(buf, roles.worker_rank(k), TAG_NOTICE)))

    def _hear(self) -> None:
        while self.listen.Test():
            self.heard = max(self.heard, int(self.notice[0]))
            self.listen = self.comm.Irecv(self.notice, MPI.ANY_SOURCE, TAG_NOTICE)

    def check(self, clock: int) -> bool:
        """True when this worker is to stop before computing ``clock`` (workers only)."""
        if not self.every:
            self._hear()
            self.signum = max(self.heard, received())
            return self.signum != 0
        if clock < self.next_check:
            return False
        if self._finish_round():
            return True
        self._hear()
        now, (then, since) = time.perf_counter(), self.timer
        per_clock = 1e6 * (now - then) / (clock - since) if clock > since else 0
        self.mine[:] = max(self.heard, received()), per_clock
        self.timer = (now, clock)
        self.round = (self.workers.Iallreduce(self.mine, self.result, op=MPI.MAX), clock)
        self.next_check = clock + self.every
        return False

    def _finish_round(self) -> bool:
        if self.round is None:
            return False
        request, clock = self.round
        wait.wait(request, f"the other workers to reach clock {clock} (the stop check)",
                  serve=self.serve)
        self.round = None
        self.signum, per_clock = int(self.result[0]), int(self.result[1])
        if not self.fixed and per_clock:   # the same on every worker: the same next check
            self.every = min(max(math.ceil(CHECK_S * 1e6 / per_clock), self.least), self.most)
        return self.signum != 0

    def close(self, end_step: int = 0) -> int:
        """End the notices and checks (signals from now on only end the run as it is).

        On workers, returns the slowest worker's ``end_step`` (the clock it stopped at).
        """
        set_notify(None)
        wait.waitall([req for _, req in self.sent], "the workers to take the stop notices")
        if not self.roles.is_worker:
            return end_step
        self._finish_round()   # every worker reaches the same last clock
        self.listen.Cancel()
        wait.wait(self.listen, "this rank's stop notice receive to be cancelled")
        mine, result = np.array([-end_step, self.signum], np.int64), np.zeros(2, np.int64)
        wait.wait(self.workers.Iallreduce(mine, result, op=MPI.MAX),
                  "the other workers to end their training")
        self.signum = int(result[1])
        return int(-result[0])

    def share_end(self, end_step: int) -> int:
        """Every rank learns the lead worker's last step and the stop's signal; returns the step."""
        roles = self.roles
        buf = np.array([end_step, self.signum], np.int64)
        wait.wait(self.comm.Ibcast(buf, root=roles.lead_worker),
                  f"worker rank {roles.lead_worker} to say where training ended")
        self.signum = int(buf[1])
        return int(buf[0])
