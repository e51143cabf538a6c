"""Fault injection for tests: ``PSGD_X_FAULT="rank=R,step=N,kind=raise|kill|nan|hang|numpy"`` makes rank R fail.

Read once per rank with :func:`for_rank`, which returns ``None`` when the
variable is unset or names another rank, so the hook in a training loop is a
single ``if fault is not None`` per step.  ``step`` means:

* on a worker, the clock (checked after the worker's own non-finite check, so
  ``nan`` reaches the push, or the all-reduce, as a poisoned gradient);
* on a bsp/ssp/asp server, the number of pushes it has received before this one
  (``nan`` poisons the received payload);
* on a hogwild server, the number of updates all workers have made (the global
  counter);
* on a ``psgd join`` worker (its own job's rank 0), the clock, fired after its push is
  posted and before it completes (mid-push).

Kinds: ``raise`` raises :class:`InjectedFault`; ``numpy`` makes numpy raise its own
ValueError (adding vectors of different lengths, as a kernel's bug would); ``kill`` sends SIGKILL to this
process (after one line on stderr naming the rank and pid, since a killed
process can say nothing and MPICH's own message names only the pid);
``nan`` writes NaN into the vector passed to :meth:`Fault.at`; ``hang`` sleeps
forever (alive, not progressing: only the stall abort ends the job); ``stop``
sends SIGSTOP to this process (frozen, as by ``kill -STOP``: its threads too).

``phase=LABEL`` instead of ``step`` fires on entering the set-up or teardown
phase of that label (:mod:`psgd.mpi.phase`), e.g.
``PSGD_X_FAULT="rank=2,phase=making the push window,kind=stop"``.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

from psgd.errors import UsageError

ENV = "PSGD_X_FAULT"
KINDS = ("raise", "kill", "nan", "hang", "stop", "numpy")


class InjectedFault(RuntimeError):
    """The failure that PSGD_X_FAULT asked for."""


class Fault:
    """One injected fault: rank ``rank`` fails with ``kind`` at step ``step`` (or on entering
    phase ``phase``, when given)."""

    __slots__ = ("rank", "step", "kind", "fired", "phase")

    def __init__(self, rank: int, step: int, kind: str, phase: str | None = None) -> None:
        self.rank, self.step, self.kind, self.fired, self.phase = rank, step, kind, False, phase

    def at(self, step: int, vector: np.ndarray | None = None) -> None:
        """Fire (once) when ``step`` reaches this fault's step; ``nan`` poisons ``vector``."""
        if step >= self.step and not self.fired and self.phase is None:
            self.fired = True
            self.fire(step, vector)

    def at_phase(self, label: str) -> None:
        """Fire (once) on entering the phase this fault names."""
        if label == self.phase and not self.fired:
            self.fired = True
            self.fire(-1)

    def fire(self, step: int, vector: np.ndarray | None = None) -> None:
        where = f"rank {self.rank} (pid {os.getpid()}) " + (
            f'in phase "{self.phase}"' if self.phase is not None else f"at step {step}")
        if self.kind == "raise":
            raise InjectedFault(f"fault injected by {ENV} at step {step}")
        if self.kind == "numpy":
            np.add(np.zeros(2, np.float32), np.zeros(3, np.float32))
        if self.kind == "nan":
            if vector is not None and vector.size:
                vector[0] = np.nan
            return
        print(f"psgd: {ENV}: {where}: {self.kind}", file=sys.stderr, flush=True)
        if self.kind in ("kill", "stop"):
            os.kill(os.getpid(), signal.SIGKILL if self.kind == "kill" else signal.SIGSTOP)
            return
        while True:  # hang
            time.sleep(3600)


def parse(text: str) -> Fault:
    """``"rank=R,step=N,kind=K"`` or ``"rank=R,phase=LABEL,kind=K"`` (step defaults to 0,
    kind to raise) as a :class:`Fault`."""
    fields, key = {}, None
    for item in text.split(","):
        if "=" not in item and key == "phase":   # a comma inside the phase's label
            fields["phase"] += "," + item
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in ("rank", "step", "kind", "phase"):
            raise UsageError(f"{ENV}={text!r}: expected rank=R,step=N,kind=K or "
                             f"rank=R,phase=LABEL,kind=K, got {item!r}")
        fields[key] = value.strip()
    kind = fields.get("kind", "raise")
    if kind not in KINDS:
        raise UsageError(f"{ENV}={text!r}: kind must be one of {', '.join(KINDS)}")
    try:
        return Fault(int(fields["rank"]), int(fields.get("step", 0)), kind, fields.get("phase"))
    except (KeyError, ValueError):
        raise UsageError(f"{ENV}={text!r}: rank and step must be integers") from None


def for_rank(rank: int) -> Fault | None:
    """The fault PSGD_X_FAULT injects on ``rank``, or None (unset, or another rank)."""
    text = os.environ.get(ENV)
    if not text:
        return None
    fault = parse(text)
    return fault if fault.rank == rank else None
