"""Waiting on MPI without spinning a core: Test/Iprobe with a backoff sleep, and stall reports.

MPICH's blocking calls busy-poll, so every wait in psgd polls here instead: a
few bare polls (or, inside a collective, a ``sched_yield`` spin of ``spin_s``),
then sleeps growing by ``GROWTH`` up to ``max_sleep``. A wait longer than the
stall timeout prints who this rank waits for; past the abort limit it raises
:class:`StallError` (inside a phase the watchdog times, :mod:`psgd.mpi.watchdog`
reports and ends it instead, naming the wait). Settings: :func:`configure`, then ``PSGD_STALL_TIMEOUT`` /
``PSGD_STALL_ABORT`` / ``PSGD_X_POLL_MAX_SLEEP``, then the defaults below.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence, Union

from mpi4py import MPI

from psgd.env import env_float
from psgd.mpi import phase as _phase

SPIN = 64                 # polls before the first sleep
MIN_SLEEP = 2e-5          # seconds
# Each backoff sleep is this much longer than the one before: a sleep is then at most
# half the time already waited, so a rank wakes at most half its wait late.
GROWTH = 1.5
DEFAULT_MAX_SLEEP = 1e-3  # seconds
DEFAULT_STALL_TIMEOUT = 60.0
DEFAULT_STALL_ABORT = 600.0

Describe = Union[str, Callable[[], str]]


class StallError(RuntimeError):
    """A rank waited longer than the stall abort limit."""


@dataclass(frozen=True)
class Limits:
    """The waits' limits in seconds: the longest backoff sleep, when a stall is reported and
    when it ends the job."""

    max_sleep: float
    stall_timeout: float
    stall_abort: float


settings = Limits(max_sleep=env_float("PSGD_X_POLL_MAX_SLEEP", DEFAULT_MAX_SLEEP),
                  stall_timeout=env_float("PSGD_STALL_TIMEOUT", DEFAULT_STALL_TIMEOUT),
                  stall_abort=env_float("PSGD_STALL_ABORT", DEFAULT_STALL_ABORT))


def configure(*, stall_timeout: float | None = None, stall_abort: float | None = None,
              max_sleep: float | None = None) -> None:
    """Set the stall report/abort limits (seconds) and the longest backoff sleep: this
    process's :data:`settings` become new limits (the old record is left as it was)."""
    global settings
    given = {"stall_timeout": stall_timeout, "stall_abort": stall_abort, "max_sleep": max_sleep}
    settings = replace(settings, **{k: float(v) for k, v in given.items() if v is not None})


class Poller:
    """Backoff and stall bookkeeping for one wait; call :meth:`idle` after each failed poll.

    ``what`` names what the wait is for (a string, or a callable built only if
    a stall is reported); ``progress``: see below; ``spin_s`` > 0: yield-spin
    for that many seconds before the first sleep (instead of ``SPIN`` bare polls).
    """

    __slots__ = ("what", "start", "polls", "sleep", "reported", "progress", "mark", "spin_until")

    def __init__(self, what: Describe, progress: Callable[[], object] | None = None,
                 spin_s: float = 0.0) -> None:
        self.what = what
        self.start = time.monotonic()
        self.polls = 0
        self.sleep = MIN_SLEEP
        self.reported = False
        # a long wait that is not a stall (a hogwild server idles while the workers train):
        # ``progress()`` is read at each stall check; a changed value restarts the stall clock
        self.progress = progress
        self.mark = progress() if progress is not None else None
        self.spin_until = time.perf_counter() + spin_s if spin_s > 0 else 0.0

    def idle(self) -> None:
        self.polls += 1
        if self.spin_until:
            if time.perf_counter() < self.spin_until:
                os.sched_yield()
                return
            self.spin_until = 0.0
        elif self.polls <= SPIN:
            return
        time.sleep(self.sleep)
        self.sleep = min(self.sleep * GROWTH, settings.max_sleep)
        if (self.polls & 63) == 0:
            self._check_stall()

    def waited(self) -> float:
        """Seconds since this wait began."""
        return time.monotonic() - self.start

    def restart(self) -> None:
        """Progress was made: poll densely again (bare polls, then the shortest sleeps)."""
        self.polls = 0
        self.sleep = MIN_SLEEP

    def _describe(self) -> str:
        return self.what() if callable(self.what) else self.what

    def _check_stall(self) -> None:
        if self.progress is not None:
            mark = self.progress()
            if mark != self.mark:
                self.mark, self.start, self.reported = mark, time.monotonic(), False
                _phase.beat()
                return
        if _phase.covered(self._describe):
            return
        waited = time.monotonic() - self.start
        if not self.reported and waited > settings.stall_timeout:
            self.reported = True
            rank = MPI.COMM_WORLD.Get_rank()
            print(f"psgd: rank {rank} stalled: waiting {waited:.0f} s for {self._describe()}"
                  f"{_phase.peers()}", file=sys.stderr, flush=True)
        if waited > settings.stall_abort:
            rank = MPI.COMM_WORLD.Get_rank()
            raise StallError(f"rank {rank} waited {waited:.0f} s (> stall abort limit "
                             f"{settings.stall_abort:g} s) for {self._describe()}{_phase.peers()}")


def wait(request: MPI.Request, what: Describe, status: MPI.Status | None = None,
         progress: Callable[[], object] | None = None, spin_s: float = 0.0,
         serve: Callable[[], None] | None = None) -> None:
    """Complete one request, sleeping between polls (``progress``, ``spin_s``: see :class:`Poller`);
    ``serve()``, when given, runs between polls (a rank that others wait on keeps answering)."""
    poller = Poller(what, progress, spin_s)
    while not request.Test(status):
        if serve is not None:
            serve()
        poller.idle()


def waitall(requests: Sequence[MPI.Request], what: Describe, spin_s: float = 0.0,
            serve: Callable[[], None] | None = None) -> None:
    """Complete all requests, sleeping between polls (after a yield spin of ``spin_s`` seconds;
    ``serve()``, when given, runs between polls, as for :func:`wait`).

    Each time some of them complete, the backoff starts over: the rest
    usually follow within microseconds (a pull's payload right behind its
    header), and a rank that slept on would take them up to a whole backoff
    sleep late.  A yield-spinning wait (``spin_s`` > 0, inside a collective)
    polls with the cheaper ``Testall``: its partners are due within the spin.
    """
    if spin_s > 0:
        poller = Poller(what, spin_s=spin_s)
        while not MPI.Request.Testall(requests):
            poller.idle()
        return
    pending = sum(map(bool, requests))
    if not pending:
        return
    poller = Poller(what)
    testsome = MPI.Request.Testsome
    while True:
        done = testsome(requests)
        if done is None:      # every request is null: all complete
            return
        if done:
            pending -= len(done)
            if pending <= 0:
                return
            poller.restart()
        else:
            if serve is not None:
                serve()
            poller.idle()


def probe(comm: MPI.Comm, source: int, tag: int, status: MPI.Status, what: Describe) -> None:
    """Block until a message matching (source, tag) is pending, sleeping between polls."""
    poller = Poller(what)
    while not comm.Iprobe(source, tag, status):
        poller.idle()


def barrier(comm: MPI.Comm, what: Describe = "the other ranks at a barrier") -> None:
    """A barrier that does not spin: Ibarrier completed with :func:`wait`."""
    wait(comm.Ibarrier(), what)
