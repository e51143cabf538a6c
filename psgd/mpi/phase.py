"""Phase labels: what a rank's main thread is doing in set-up and teardown, for the stall watchdog.

Every blocking step outside the training loop runs inside ``with phase("making
the push window"):``. The label and the moment it was entered are what the
watchdog (:mod:`psgd.mpi.watchdog`) reads to report a rank stuck in any call,
MPI's blocking ones included, and what each rank announces to the others so
that they can name a rank that stopped answering. A phase entered with
``watch=False`` (the training loop, a server's serving loop) is labelled but
not timed: the waits there report their own stalls (:mod:`psgd.mpi.wait`).
Phases nest; the innermost one is the rank's phase.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, NamedTuple

from psgd.errors import launcher_rank
from psgd.mpi import faults

RECENT_S = 1.0   # a wait noted within this long is the one the main thread is in

# Held by the watchdog thread for its MPI calls, and by the main thread around passive-target
# RMA outside the training loop (hogwild's window locks): MPICH's ch4 RMA state is not safe
# against another thread driving MPI's progress meanwhile (seen: an assertion in
# mpidig_rma_callbacks.c; pmodels/mpich#5971, #6292). In the training loop the watchdog makes
# no MPI call at all.
rma_lock = threading.RLock()


class Current(NamedTuple):
    """The innermost phase: its label, when it was entered (``time.monotonic``), whether it is
    timed, and a number that changes at every phase change."""

    label: str
    since: float
    watched: bool
    seq: int


class _State:
    def __init__(self) -> None:
        self.stack: list[Current] = []
        self.current = Current("", time.monotonic(), False, 0)   # read by the watchdog thread
        self.seq = 0
        self.listener: Callable[[str], None] | None = None   # the watchdog's announce
        self.ask: Callable[[], str] | None = None            # the watchdog's peers
        self.waiting: tuple | None = None   # (seq, describe, when) of the wait noted last
        self.fault = None
        self.fault_read = False


_state = _State()


@contextmanager
def phase(label: str, watch: bool = True):
    """Run the body as phase ``label`` (timed by the watchdog unless ``watch`` is False).

    A ``PSGD_X_FAULT`` with ``phase=LABEL`` for this rank fires on entering it (tests).
    """
    _state.stack.append(Current(label, time.monotonic(), watch, 0))
    _changed()
    _fault_at(label)
    try:
        yield
    finally:
        _state.stack.pop()
        _changed()


def _changed() -> None:
    _state.seq += 1
    top = _state.stack[-1] if _state.stack else Current("", time.monotonic(), False, 0)
    _state.current = top._replace(seq=_state.seq)
    if _state.listener is not None:
        _state.listener(top.label)


def _fault_at(label: str) -> None:
    if not _state.fault_read:
        _state.fault, _state.fault_read = faults.for_rank(launcher_rank()), True
    if _state.fault is not None:
        _state.fault.at_phase(label)


def beat() -> None:
    """The main thread made progress in a long phase (a wait whose ``progress`` moved): the
    phase's clock starts again."""
    if _state.stack:
        _state.seq += 1
        _state.current = _state.current._replace(since=time.monotonic(), seq=_state.seq)


def current() -> Current:
    """This rank's innermost phase (safe to read from another thread)."""
    return _state.current


def listen(listener: Callable[[str], None] | None, ask: Callable[[], str] | None = None) -> None:
    """Call ``listener(label)`` at every phase change (None: stop); the watchdog announces so.

    ``ask()`` returns what the other ranks say (see :func:`peers`).
    """
    _state.listener, _state.ask = listener, ask


def peers() -> str:
    """The watchdog's words on the other ranks ("; rank 2 does not answer ..."), or "" when no
    watchdog runs; takes up to about a second (for a stall report from the main thread)."""
    return _state.ask() if _state.ask is not None else ""


def covered(describe: Callable[[], str]) -> bool:
    """Whether the watchdog times the phase this wait is in; if so, note what it waits for.

    Called at each stall check of a :class:`psgd.mpi.wait.Poller`: inside a
    watched phase the watchdog reports (and ends) the stall, naming the wait.
    """
    cur = _state.current
    if _state.listener is None or not cur.watched:
        return False
    _state.waiting = (cur.seq, describe, time.monotonic())
    return True


def waiting_for() -> str | None:
    """What the main thread's wait in this phase is for, if it is in one now."""
    noted, cur = _state.waiting, _state.current
    if noted is None or noted[0] != cur.seq or time.monotonic() - noted[2] > RECENT_S:
        return None
    try:
        return noted[1]()
    except Exception:  # noqa: BLE001 - built from the main thread's state while it changes
        return None
