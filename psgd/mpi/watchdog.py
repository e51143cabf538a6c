"""The stall watchdog: a thread on every rank that reports, then ends, a phase stuck past its limits.

The main thread labels its set-up and teardown steps (:mod:`psgd.mpi.phase`);
this thread reads the label and when it was entered. Past the stall timeout it
prints one line (the rank, the phase, how long, and the wait the main thread is
in when it is in one of psgd's); past the abort limit it prints one
``psgd: error:`` line and ends the job with ``MPI_Abort``. mpi4py releases the
GIL inside MPI's blocking calls, so the thread runs while the main thread is
blocked in a collective (``Split_type``, ``Win_allocate_shared``, ...), and
MPI is initialised with ``MPI_THREAD_MULTIPLE``, so it may call MPI.

The peers. On a side communicator, every rank announces each phase change to
the others, and its watchdog answers queries with its phase. A stalled rank
asks every rank; one that does not answer within ``REPLY_S`` is stopped
(SIGSTOP), dead to MPI, or holding the GIL, and the report names it with the
phase it announced last and how long ago. In the training loop (an untimed
phase) the thread makes no MPI call at all, so a rank there is named as busy
in it, not as silent; its MPI calls elsewhere are made under
:data:`psgd.mpi.phase.rma_lock`.
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from psgd.errors import abort_job
from psgd.mpi import phase as _phase

LABEL_BYTES = 120
TAG_LABEL, TAG_QUERY, TAG_ANSWER = 1, 2, 3
TICK_S = 0.05      # how often the thread looks, in a timed phase
IDLE_TICK_S = 0.25  # outside one (it only answers the other ranks)
REPLY_S = 1.0      # how long a stalled rank waits for the others' answers
MAX_LISTED = 6     # ranks named in one report
NO_PHASE = "(none)"


def _pack(label: str, age: float = 0.0) -> np.ndarray:
    buf = np.zeros(8 + LABEL_BYTES, np.uint8)
    buf[:8].view(np.float64)[0] = age
    text = label.encode()[:LABEL_BYTES]
    buf[8:8 + len(text)] = np.frombuffer(text, np.uint8)
    return buf


def _unpack(buf: np.ndarray) -> tuple[str, float]:
    return bytes(buf[8:]).rstrip(b"\0").decode(errors="replace"), float(buf[:8].view(np.float64)[0])


class Watchdog:
    """The watching thread of one rank (start with :func:`start`, end with :meth:`stop`).

    Parameters
    ----------
    comm : MPI.Intracomm
        A communicator of every rank of the job used by nothing else (a ``Dup``
        of the job's): announcements, queries and answers travel on it.
    stall_timeout, stall_abort : float
        Seconds in one timed phase before the report, and before ``MPI_Abort``.
    """

    def __init__(self, comm: MPI.Intracomm, stall_timeout: float, stall_abort: float) -> None:
        self.comm, self.timeout, self.abort = comm, float(stall_timeout), float(stall_abort)
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        now = time.monotonic()
        # rank -> (label, heard at, timed): the phase it announced last
        self.heard = {r: ("", now, False) for r in range(self.size)}
        self.answers: dict[int, tuple[str, float, float]] = {}  # rank -> (label, age, at)
        self.sends: list = []        # (buffer, request) of the main thread's announcements
        self.replies: list = []      # the same, of this thread's queries and answers
        self.inbox = np.zeros(8 + LABEL_BYTES, np.uint8)
        self.status = MPI.Status()
        self.reported_seq = -1
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="psgd-watchdog", daemon=True)

    # ------------------------------------------------------------ main thread

    def announce(self, label: str) -> None:
        """Tell every other rank this rank's phase (main thread, at each phase change)."""
        buf = _pack(label, float(_phase.current().watched))
        with _phase.rma_lock:
            self.sends = [(b, q) for b, q in self.sends if not q.Test()]
            for r in range(self.size):
                if r != self.rank:
                    self.sends.append((buf, self.comm.Isend(buf, dest=r, tag=TAG_LABEL)))

    def peers(self) -> str:
        """What the other ranks answer (main thread: a wait outside a timed phase stalls)."""
        return "" if self.done.is_set() else self._ask()

    def stop(self) -> None:
        """End the thread (idempotent); announcements stop with it."""
        if self.done.is_set():
            return
        _phase.listen(None)
        self.done.set()
        self.thread.join()
        for _, request in self.sends + self.replies:   # to ranks that have gone on or away
            if request:
                request.Free()
        self.sends, self.replies = [], []
        self.comm.Free()

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        while not self.done.wait(TICK_S if _phase.current().watched else IDLE_TICK_S):
            cur = _phase.current()
            if not cur.watched:   # the training loop: no MPI call from this thread
                continue
            self._drain()
            age = time.monotonic() - cur.since
            if age > self.abort:
                self._end(cur, age)
                return
            if age > self.timeout and self.reported_seq != cur.seq:
                self.reported_seq = cur.seq
                peers = self._ask()
                if _phase.current().seq == cur.seq:   # still stuck after the questions
                    age = time.monotonic() - cur.since
                    print(f"psgd: rank {self.rank} stalled: {self._head(cur, age)}{peers}",
                          file=sys.stderr, flush=True)

    def _end(self, cur: _phase.Current, age: float) -> None:
        peers = self._ask()
        print(f"psgd: error: rank {self.rank}: stalled {age:.0f} s (> stall abort limit "
              f"{self.abort:g} s) in phase \"{cur.label}\"{self._waiting()}{peers}",
              file=sys.stderr, flush=True)
        abort_job(1)

    def _head(self, cur: _phase.Current, age: float) -> str:
        return f"{age:.0f} s in phase \"{cur.label}\"{self._waiting()}"

    @staticmethod
    def _waiting() -> str:
        what = _phase.waiting_for()
        return f", waiting for {what}" if what else ""

    def _drain(self) -> bool:
        """Take every message that has come: announcements, queries (answered), answers;
        False when the main thread holds :data:`psgd.mpi.phase.rma_lock` (nothing taken)."""
        if not _phase.rma_lock.acquire(timeout=TICK_S):
            return False
        try:
            self._take()
        finally:
            _phase.rma_lock.release()
        return True

    def _take(self) -> None:
        self.replies = [(b, q) for b, q in self.replies if not q.Test()]
        while self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, self.status):
            source, tag = self.status.Get_source(), self.status.Get_tag()
            self.comm.Recv(self.inbox, source=source, tag=tag)
            if tag == TAG_LABEL:
                label, timed = _unpack(self.inbox)
                self.heard[source] = (label, time.monotonic(), bool(timed))
            elif tag == TAG_ANSWER:
                label, age = _unpack(self.inbox)
                self.answers[source] = (label, age, time.monotonic())
            elif tag == TAG_QUERY:
                cur = _phase.current()
                buf = _pack(cur.label, time.monotonic() - cur.since)
                self.replies.append((buf, self.comm.Isend(buf, dest=source, tag=TAG_ANSWER)))

    def _ask(self) -> str:
        """Ask every other rank its phase; the report's part on the peers ('' when alone)."""
        if self.size == 1:
            return ""
        query = np.zeros(8 + LABEL_BYTES, np.uint8)
        others = [r for r in range(self.size) if r != self.rank]
        if not _phase.rma_lock.acquire(timeout=REPLY_S):
            return "; (the other ranks not asked: this rank is inside an RMA call)"
        try:
            asked = time.monotonic()
            self.replies += [(query, self.comm.Isend(query, dest=r, tag=TAG_QUERY))
                             for r in others]
        finally:
            _phase.rma_lock.release()
        while time.monotonic() - asked < REPLY_S and not self.done.is_set():
            self._drain()
            if all(self.answers.get(r, ("", 0, 0))[2] >= asked for r in others):
                break
            time.sleep(0.01)
        silent = [r for r in others if self.answers.get(r, ("", 0, 0))[2] < asked]
        return describe_peers(silent, self.heard, self.answers, _phase.current().label)


def describe_peers(silent: list[int], heard: dict, answers: dict, mine: str) -> str:
    """The report's part on the other ranks: those that did not answer, with the phase they
    announced last; else those in another phase than ``mine``."""
    now = time.monotonic()
    # a rank in the training loop answers only when it next waits in a phase: not a suspect
    busy = [r for r in silent if heard[r][0] and not heard[r][2]]
    silent = [r for r in silent if r not in busy]
    if silent:
        named = "; ".join(f"rank {r} does not answer (stopped, or stuck holding the GIL), last "
                          f"heard entering phase \"{heard[r][0] or NO_PHASE}\" "
                          f"{now - heard[r][1]:.0f} s ago" for r in silent[:MAX_LISTED])
        more = f"; and {len(silent) - MAX_LISTED} more" if len(silent) > MAX_LISTED else ""
        return f"; {named}{more}" + _busy(busy, heard, now)
    other = [(r, answers[r][0], answers[r][1]) for r in sorted(answers)
             if answers[r][0] != mine and r not in busy]
    if not other:
        return ("; every rank answers, in the same phase" if not busy else "") + _busy(busy, heard, now)
    listed = ", ".join(f"rank {r} in \"{label or NO_PHASE}\" for {age:.0f} s"
                       for r, label, age in other[:MAX_LISTED])
    return f"; the others answer: {listed}" + (" ..." if len(other) > MAX_LISTED else "")


def _busy(busy: list[int], heard: dict, now: float) -> str:
    if not busy:
        return ""
    return "; " + ", ".join(f"rank {r} in \"{heard[r][0]}\" since {now - heard[r][1]:.0f} s"
                            for r in busy[:MAX_LISTED])


def start(comm: MPI.Intracomm, stall_timeout: float, stall_abort: float) -> Watchdog:
    """Start this rank's watchdog on ``comm`` (see :class:`Watchdog`); phases announce from now on."""
    dog = Watchdog(comm, stall_timeout, stall_abort)
    _phase.listen(dog.announce, dog.peers)
    dog.thread.start()
    dog.announce(_phase.current().label)
    return dog
