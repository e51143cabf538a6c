"""The order in which a server shard handled its workers: recorded, or replayed from a record.

An event is ``(kind, worker, clock)`` as int32: a push applied, a pull
answered, or a worker done. Under :class:`Recorder` the server handles
messages in arrival order and writes each event down; under :class:`Replay`
it takes messages only from the worker of the next recorded event and answers
a held pull only when the record says so, so every push meets the same
parameters and every reply carries the same ones as in the recorded run.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.errors import PsgdError

PUSHED, REPLIED, DONE = 1, 2, 3
NAMES = {PUSHED: "push", REPLIED: "reply to the pull", DONE: "done"}
BLOCK = 4096   # events per growth step of the record


class Order:
    """Arrival order, nothing written down (the default)."""

    replaying = False

    def source(self, n_servers: int) -> int:
        """The rank whose next control message the server may take."""
        return MPI.ANY_SOURCE

    def may_answer(self, worker: int, clock: int, within_bound: bool) -> bool:
        return within_bound

    def pushed(self, worker: int, clock: int) -> None:
        """A push was applied."""

    def replied(self, worker: int, clock: int) -> None:
        """A pull was answered."""

    def done(self, worker: int) -> None:
        """A worker said it was done."""

    def events(self) -> np.ndarray | None:
        return None


class Recorder(Order):
    """Arrival order, every event written down (``--record``)."""

    def __init__(self) -> None:
        self._events = np.zeros((BLOCK, 3), np.int32)
        self._n = 0

    def _add(self, kind: int, worker: int, clock: int) -> None:
        if self._n == len(self._events):
            self._events = np.concatenate([self._events, np.zeros_like(self._events)])
        self._events[self._n] = (kind, worker, clock)
        self._n += 1

    def pushed(self, worker: int, clock: int) -> None:
        self._add(PUSHED, worker, clock)

    def replied(self, worker: int, clock: int) -> None:
        self._add(REPLIED, worker, clock)

    def done(self, worker: int) -> None:
        self._add(DONE, worker, -1)

    def events(self) -> np.ndarray:
        """int32 (n, 3): kind, worker, clock of every event, in order."""
        return self._events[:self._n].copy()


class Replay(Order):
    """The recorded order (``--replay``): one event at a time, each from its own worker."""

    replaying = True

    def __init__(self, events: np.ndarray, shard: int) -> None:
        self._events = np.asarray(events, np.int32)
        self._next = 0
        self.shard = shard

    def _head(self) -> tuple[int, int, int] | None:
        if self._next == len(self._events):
            return None
        kind, worker, clock = (int(v) for v in self._events[self._next])
        return kind, worker, clock

    def source(self, n_servers: int) -> int:
        head = self._head()
        return MPI.ANY_SOURCE if head is None else n_servers + head[1]

    def may_answer(self, worker: int, clock: int, within_bound: bool) -> bool:
        return self._head() == (REPLIED, worker, clock)

    def _expect(self, kind: int, worker: int, clock: int) -> None:
        head = self._head()
        if head != (kind, worker, clock):
            want = "nothing more (the record ends here)" if head is None else \
                f"worker {head[1]}'s {NAMES[head[0]]}" + (f" of clock {head[2]}" if head[2] >= 0 else "")
            got = f"worker {worker}'s {NAMES[kind]}" + (f" of clock {clock}" if clock >= 0 else "")
            raise PsgdError(f"--replay: shard {self.shard} got {got} as event {self._next}, where "
                            f"the record has {want}: this run is not the recorded one")
        self._next += 1

    def pushed(self, worker: int, clock: int) -> None:
        self._expect(PUSHED, worker, clock)

    def replied(self, worker: int, clock: int) -> None:
        self._expect(REPLIED, worker, clock)

    def done(self, worker: int) -> None:
        self._expect(DONE, worker, -1)

    def describe(self) -> str:
        """What the replay waits for, for stall reports."""
        head = self._head()
        if head is None:
            return "the end of the record"
        return f"recorded event {self._next}: worker {head[1]}'s {NAMES[head[0]]}" + \
            (f" of clock {head[2]}" if head[2] >= 0 else "")
