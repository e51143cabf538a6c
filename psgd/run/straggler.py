"""Straggler emulation (``--straggler``): per-worker slow-downs and seeded transient pauses, by sleeping.

A spec is entries separated by ``;``, each ``WORKERS:KEY=VALUE[,KEY=VALUE]``
with WORKERS ``all``, ``k`` or ``a-b`` (worker indices, 0-based) and keys
``slow=f`` (after its real compute a step waits (f - 1) x that compute time),
``p=q`` and ``d=t`` (each step pauses t seconds with probability q; ``d=5x``:
five times the worker's mean compute time so far).  Entries add up per worker.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from psgd.errors import UsageError

FORMAT = "WORKERS:KEY=VALUE[,KEY=VALUE][;...] (WORKERS all, k or a-b; keys slow, p, d)"
_DRAW_KEY = 0x5EED57  # the pause draws' stream, apart from the data's shuffling


@dataclass
class Slowdown:
    """What one worker does after each step's compute (the sum of the spec's entries for it)."""

    factor: float = 1.0          # compute takes this many times as long
    p: float = 0.0               # probability of a pause per step
    d: float = 0.0               # pause length: seconds, or multiples of the mean compute time
    d_relative: bool = False     # d in multiples of the mean compute time (``d=5x``)

    @property
    def active(self) -> bool:
        return self.factor > 1.0 or (self.p > 0.0 and self.d > 0.0)


def _number(entry: str, key: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--straggler {entry!r}: {key} must be a number, got {text!r}") from None
    if not np.isfinite(value):
        raise UsageError(f"--straggler {entry!r}: {key} must be finite, got {text!r}")
    return value


def _workers(entry: str, text: str) -> tuple[int, int | None]:
    """``(first, last)`` worker indices (last None: every worker from first)."""
    if text == "all":
        return 0, None
    lo, sep, hi = text.partition("-")
    try:
        first, last = int(lo), int(hi if sep else lo)
    except ValueError:
        raise UsageError(f"--straggler {entry!r}: workers must be all, k or a-b, "
                         f"got {text!r}") from None
    if first < 0 or last < first:
        raise UsageError(f"--straggler {entry!r}: workers {text!r} is not a range of worker "
                         f"indices >= 0")
    return first, last


def parse(spec: str | None) -> list[tuple[int, int | None, Slowdown]]:
    """The entries of a spec as ``(first, last, Slowdown)``; ValueError naming a bad one.

    ``last`` is None for ``all``.  Worker indices are checked against the job's
    workers by :func:`for_worker`.
    """
    entries = []
    for entry in (spec or "").split(";"):
        entry = entry.strip()
        if not entry:
            continue
        who, sep, body = entry.partition(":")
        if not sep or not body.strip():
            raise UsageError(f"--straggler {entry!r}: expected {FORMAT}")
        first, last = _workers(entry, who.strip())
        slow = Slowdown()
        for item in body.split(","):
            key, eq, value = (x.strip() for x in item.partition("="))
            if not eq:
                raise UsageError(f"--straggler {entry!r}: {item.strip()!r} is not KEY=VALUE")
            if key == "slow":
                slow.factor = _number(entry, key, value)
                if slow.factor < 1:
                    raise UsageError(f"--straggler {entry!r}: slow=f needs f >= 1 (f times "
                                     f"slower), got {value}")
            elif key == "p":
                slow.p = _number(entry, key, value)
                if not 0 <= slow.p <= 1:
                    raise UsageError(f"--straggler {entry!r}: p is a probability in [0, 1], "
                                     f"got {value}")
            elif key == "d":
                slow.d_relative = value.endswith("x")
                slow.d = _number(entry, key, value[:-1] if slow.d_relative else value)
                if slow.d < 0:
                    raise UsageError(f"--straggler {entry!r}: d must be >= 0, got {value}")
            else:
                raise UsageError(f"--straggler {entry!r}: unknown key {key!r} (slow, p or d)")
        if (slow.p > 0) != (slow.d > 0):
            raise UsageError(f"--straggler {entry!r}: a transient pause needs both p > 0 "
                             f"and d > 0")
        entries.append((first, last, slow))
    return entries


def for_worker(spec: str | None, worker: int, n_workers: int) -> Slowdown:
    """The slow-down of worker ``worker`` of ``n_workers``; ValueError for a worker the job lacks."""
    out = Slowdown()
    for first, last, slow in parse(spec):
        if (last if last is not None else first) >= n_workers:
            raise UsageError(f"--straggler names worker {last if last is not None else first}, "
                             f"but the job has {n_workers} workers (0..{n_workers - 1})")
        if first <= worker and (last is None or worker <= last):
            out.factor *= slow.factor
            if slow.p > 0:
                if out.p > 0:
                    raise UsageError(f"--straggler gives worker {worker} two transient pauses; "
                                     f"give one p and d per worker")
                out.p, out.d, out.d_relative = slow.p, slow.d, slow.d_relative
    return out


class Straggler:
    """Worker ``worker``'s slow-down, applied by :meth:`after_compute` (sleeps; never spins).

    The pause of clock c is drawn from a generator seeded by ``(seed, worker,
    c)``, so a run repeats its pauses, also after a resume.

    Attributes
    ----------
    slept_s : float
        Seconds slept so far (the slow-down plus the pauses).
    pauses : list of int
        The clocks that paused.
    """

    def __init__(self, slowdown: Slowdown, seed: int, worker: int, sleep=time.sleep) -> None:
        self.slowdown, self.seed, self.worker = slowdown, int(seed), int(worker)
        self.sleep = sleep
        self.slept_s = 0.0
        self.pauses: list[int] = []
        self._compute_s = 0.0
        self._steps = 0

    def pauses_at(self, clock: int) -> bool:
        """Whether clock ``clock`` draws a transient pause."""
        s = self.slowdown
        if s.p <= 0:
            return False
        draw = np.random.default_rng([self.seed, _DRAW_KEY, self.worker, int(clock)]).random()
        return bool(draw < s.p)

    def after_compute(self, clock: int, compute_s: float) -> float:
        """Wait as the spec says after a step whose real compute took ``compute_s``; the wait asked."""
        s = self.slowdown
        self._compute_s += compute_s
        self._steps += 1
        wait = (s.factor - 1.0) * compute_s
        if self.pauses_at(clock):
            self.pauses.append(int(clock))
            wait += s.d * (self._compute_s / self._steps if s.d_relative else 1.0)
        if wait > 0:
            t0 = time.perf_counter()
            self.sleep(wait)
            self.slept_s += time.perf_counter() - t0
        return wait


def make(spec: str | None, seed: int, worker: int, n_workers: int) -> Straggler | None:
    """Worker ``worker``'s :class:`Straggler`, or None when the spec leaves it alone."""
    slowdown = for_worker(spec, worker, n_workers)
    return Straggler(slowdown, seed, worker) if slowdown.active else None
