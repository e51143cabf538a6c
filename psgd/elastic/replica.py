"""Server replicas (``--replicas 2``): a backup of the shard, kept by chain replication.

The primary (:class:`Primary`, the server job) forwards to the backup (:class:`Backup`, a
``psgd join --backup`` job of its own, connected like a worker) every event that changes the
shard, in the order it applied them: each push with its gradient, each answered pull (the
update rule notes what the worker read), each join, drop and done. The backup applies them
with the same server code, so its shard follows the primary's bit for bit. It sends nothing
back, so no send ever waits on a dead primary. Each worker also links to the backup when it
joins (its standby link, through the backup's own door at ``port_file + STANDBY``): MPICH's
accept on a survivor of a SIGKILLed peer can hang, so nothing is connected after a death that
can be connected before. When the primary's process is gone (its beat,
:mod:`psgd.elastic.alive`), the backup opens a port of its own in the port file and serves:
the workers re-route (:mod:`psgd.elastic.replica_join`) over their standby links and go on
from the clock it holds.
"""
from __future__ import annotations

import os
import signal
import time
import zlib

import numpy as np
from mpi4py import MPI

from psgd.elastic import segments_of
from psgd.elastic.alive import BEAT_S, PLACE, Pulse, beat_path
from psgd.elastic.server import DONE, JOINING, LIVE, ElasticServer
from psgd.errors import PsgdError
from psgd.ps.messages import PUSH_WINDOW, TAG_PUSH

TAG_FWD = 7301
JOIN, PUSHED, REPLIED, LEFT, LOST, END = 1, 2, 3, 4, 5, 6
BACKUP = "backup-"      # a backup's knock name starts so
REROUTE = "slot"        # a re-routing worker's: slot<w>-...
BACKUP_BEAT = "backup"  # the backup's beat: beat_path(port_file, BACKUP_BEAT)
STANDBY = ".standby"    # the backup's own port file, for the workers' standby links
MAX_IN_FLIGHT = 256     # forwards not yet seen complete before the primary waits on the oldest
TRACE = "PSGD_X_REPLICA_TRACE"   # tests: a directory for both servers' records
KILL = "PSGD_X_REPLICA_KILL"     # tests: the primary SIGKILLs itself mid-forward of push N


class Trace:
    """Tests only (``PSGD_X_REPLICA_TRACE=DIR``): the primary writes ``n w clock crc`` after
    each forwarded push (crc32 of its shard then); the backup writes each push it applied
    (``int64[4] n w clock staleness`` then the float32 gradient) to ``backup.bin``, its
    shard at the start to ``init.npy`` and at the takeover to ``takeover.npy``."""

    def __init__(self, name: str) -> None:
        self.dir = os.environ.get(TRACE)
        self.fh = open(os.path.join(self.dir, name), "ab") if self.dir else None

    def write(self, data: bytes) -> None:
        if self.fh is not None:
            self.fh.write(data)
            self.fh.flush()

    def save(self, name: str, array: np.ndarray) -> None:
        if self.dir:
            np.save(os.path.join(self.dir, name), array)


class Primary(ElasticServer):
    """The server job's shard, forwarding every applied change to its backup.

    Until the backup has joined, only its knock gets a turn (``backup_s`` seconds at most:
    then the run ends, as without workers). A backup that dies is dropped (its beat), and
    the run goes on without one.
    """

    def __init__(self, *args, backup_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.backup: MPI.Intercomm | None = None
        self.backup_pulse: Pulse | None = None
        self.backup_s, self.t0 = float(backup_s), time.monotonic()
        self.in_flight: list = []   # (buffers, requests) of forwards
        self.hdr = np.zeros(6, np.int64)
        self.trace = Trace("primary.trace")
        self.kill_at = int(os.environ.get(KILL, "-1"))
        self.door.pattern = BACKUP + "*"   # the backup first
        push, replied = self.rule.push, self.rule.replied

        def pushed(grad, clock, staleness, source, borrowed=False, worker=0):
            sent = grad.copy() if self.backup is not None else None
            ok = push(grad, clock, staleness, source, borrowed, worker)
            if sent is not None:   # (the trace first: the test compares what the backup got)
                self.trace.write(f"{self.n_pushes} {worker} {clock} "
                                 f"{zlib.crc32(self.versions.live.tobytes())}\n".encode())
                self._forward(PUSHED, worker, clock, clock - staleness, sent)
            return ok

        def answered(worker, clock, live):
            self._forward(REPLIED, worker, clock)
            return replied(worker, clock, live)

        self.rule.push, self.rule.replied = pushed, answered

    def _between(self) -> bool:
        if self.backup is None and self.door.pattern != "*" and \
                time.monotonic() - self.t0 > self.backup_s and not self.over:
            self.abandoned = True
            self._end(f"no backup server joined within {self.backup_s:g} s (--replicas 2 "
                      f"waits for `psgd join --backup` before admitting workers)")
        return super()._between()

    def _admit(self, ready: str) -> None:
        if not ready.startswith(BACKUP):
            return super()._admit(ready)
        inter = self.door.admit(ready)
        if self.door.void:   # it died before it connected: a stand-in took the accept
            self.event("refused", why="the backup died while it was being admitted")
            return
        if self.door.pattern == "*":   # a backup joins before any worker, or never
            self._send_welcome(inter, {"refused": "the run has started: a backup joins only "
                                                  "before the first worker"})
            self.event("refused", why="a backup knocked after the run had started")
            return
        self._send_welcome(inter, {**self.welcome(-1, self.version), "backup": True,
                                   "updates": self.n_pushes})
        self.backup = inter
        self.backup_pulse = Pulse(beat_path(self.door.port_file, BACKUP_BEAT))
        self.door.pattern = "*"
        self.event("backup", why="joined", updates=self.n_pushes)

    def _forward(self, kind: int, w: int = -1, clock: int = 0, read: int = 0,
                 grad: np.ndarray | None = None) -> None:
        """Send one event to the backup, unless it is gone (a send to a process dead for
        seconds can crash MPICH: its beat is looked at first)."""
        if self.backup is None:
            return
        if self.backup_pulse.dead():
            self.backup = None
            self.event("backup", why="lost: its process ended", updates=self.n_pushes)
            return
        self.in_flight = [(b, r) for b, r in self.in_flight if not MPI.Request.Testall(r)]
        if len(self.in_flight) >= MAX_IN_FLIGHT:
            MPI.Request.Waitall(self.in_flight.pop(0)[1])
        hdr = np.array([kind, w, clock, read, self.n_pushes, self.version], np.int64)
        reqs = [self.backup.Isend(hdr, 0, TAG_FWD)]
        if kind == PUSHED and self.n_pushes == self.kill_at:   # tests: the header went, not
            reqs[0].Wait()                                     # the payload
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
        if grad is not None:
            reqs.append(self.backup.Isend(grad, 0, TAG_PUSH))
        self.in_flight.append(((hdr, grad), reqs))

    def _take(self, w: int, clock: int, inter, joiner=None) -> None:
        super()._take(w, clock, inter, joiner)
        self._forward(JOIN, w, clock)

    def _drop(self, w: int, why: str, tell: bool = True) -> None:
        self._forward(LOST, w)
        super()._drop(w, why, tell)

    def _control(self, msg, status) -> None:
        w = status.Get_source() - self.S
        before = self.state[w] if 0 <= w < self.W else None
        super()._control(msg, status)
        if before != DONE and 0 <= w < self.W and self.state[w] == DONE:
            self._forward(LEFT, w)

    def _end(self, why: str, tell: bool = True) -> None:
        self._forward(END)
        super()._end(why, tell)

    def replicas(self) -> dict:
        return {"replicas": 2, "servers_lost": []}


class PrimaryLost(Exception):
    """The primary's process is gone (or silent past the stall timeout)."""


class Backup(ElasticServer):
    """The backup's shard: :meth:`follow` the primary's forwards, then :meth:`take_over`."""

    def __init__(self, *args, link: MPI.Intercomm, standby=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.link, self.standby_door = link, standby
        self.standby: dict[int, MPI.Intercomm] = {}   # each worker's standby link, by slot
        self.welcomed: set[int] = set()   # slots welcomed over it at the takeover
        self.primary = Pulse(beat_path(self.door.port_file))
        self.primary.dead()   # reads who it is: a SIGKILLed primary leaves its segment to us
        who = self.primary.who
        self.segments = segments_of(who[1]) if who and who[0] == PLACE else []
        self.silence_s = 5 * self.links.silence_s   # a primary on another host: its beat
        self.staged = np.empty_like(self.rule.receive_buffer())
        self.cut_off: list = []   # a receive the primary's death left pending, and its buffer
        self.following, self.lost_record = True, []
        self.awaiting: dict[int, float] = {}   # slots whose worker has not re-routed yet
        self.trace = Trace("backup.bin")
        self.trace.save("init.npy", self.versions.live)
        if self.trace.fh is not None:   # tests: every push applied, before and after a takeover
            push = self.rule.push

            def traced(grad, clock, staleness, source, borrowed=False, worker=0):
                head = np.array([self.n_pushes, worker, clock, staleness], np.int64)
                self.trace.write(head.tobytes() + grad.tobytes())
                return push(grad, clock, staleness, source, borrowed, worker)

            self.rule.push = traced

    def follow(self, started: float) -> str:
        """Apply the primary's forwards until it ends the run ("") or is lost (why)."""
        hdr, status = np.zeros(6, np.int64), MPI.Status()
        while True:
            self._link_standby()
            try:
                msg = self._next(TAG_FWD, status)
            except PrimaryLost as lost:
                return self._primary_lost(str(lost), started)
            msg.Recv(hdr)
            kind, w, clock, read = (int(x) for x in hdr[:4])
            if kind == END:
                return ""
            try:
                self._apply(kind, w, clock, read)
            except PrimaryLost as lost:   # a header whose payload never came: not applied
                return self._primary_lost(f"{lost}; its last push came without its whole "
                                          f"gradient, which was discarded", started)

    def _next(self, tag: int, status: MPI.Status) -> MPI.Message:
        """The primary's next message with ``tag``; :class:`PrimaryLost` once it is gone."""
        look = 0.0
        while (msg := self.link.Improbe(0, tag, status)) is None:
            look = self._look_upstream(look)
            self._link_standby()
            time.sleep(0.0002)
        return msg

    def _link_standby(self) -> None:
        """Accept the standby link of a worker whose knock (``slot<w>-...``) has its turn."""
        door = self.standby_door
        if door is None:
            return
        ready, _ = door.look()
        if ready is None:
            return
        inter = door.admit(ready)
        door.joiners.pop(ready, None)
        if not door.void:   # void: it died before it connected (a stand-in took the accept)
            self.standby[int(ready[len(REROUTE):].split("-", 1)[0])] = inter

    def _look_upstream(self, when: float) -> float:
        """Raise :class:`PrimaryLost` if the primary is gone (looked at from ``when`` on); the
        time to look next."""
        now = time.monotonic()
        if now < when:
            return when
        why = self.primary.gone(self.silence_s)
        if why:
            raise PrimaryLost(why)
        return now + BEAT_S / 5

    def _receive_gradient(self, clock: int) -> None:
        """The forwarded push's gradient into ``staged``; a transfer cut by the primary's death
        is abandoned (its buffer with it: MPI may still hold it)."""
        status = MPI.Status()
        msg = self._next(TAG_PUSH, status)
        if status.Get_count(MPI.BYTE) != self.staged.nbytes:
            raise PsgdError(f"the primary forwarded a gradient of {status.Get_count(MPI.BYTE)} "
                            f"bytes for clock {clock}; the shard holds {self.staged.nbytes}")
        req, look = msg.Irecv(self.staged), 0.0
        while not req.Test():
            try:
                look = self._look_upstream(look)
            except PrimaryLost:   # MPI may still write into the buffer: both kept for good
                self.cut_off.append((req, self.staged))
                self.staged = np.empty_like(self.staged)
                raise
            time.sleep(0.0002)

    def _apply(self, kind: int, w: int, clock: int, read: int) -> None:
        if kind == PUSHED:   # applied as if read in place (_window_slice): the same rule
            self._receive_gradient(clock)
            np.copyto(self.rule.receive_buffer(), self.staged)
            self.ctrl[:] = (PUSH_WINDOW, clock, read, self.shard)
            self._push(self.S + w, w, clock, read, PUSH_WINDOW)
            self.n_window_pushes -= 1
        elif kind == REPLIED:
            self.rule.replied(w, clock, self.versions.live)
        elif kind == JOIN:
            self._take(w, clock, None)
        elif kind == LEFT:
            self.order.done(w)
            self.rule.worker_done(w)
            self.done[w], self.state[w] = True, DONE
            self.n_done += 1
            self.span[w, 1] = self.n_pushes
            self.links.drop(w)
            self._update_version()
        elif kind == LOST:
            self._drop(w, "the primary dropped it", tell=False)

    def _window_slice(self, source: int, clock: int) -> np.ndarray:
        return self.rule.receive_buffer()   # the forwarded gradient, received by _apply

    def _take(self, w: int, clock: int, inter, joiner=None) -> None:
        if inter is not None:   # a new worker after the takeover
            return super()._take(w, clock, inter, joiner)
        self.state[w], self.first[w], self.span[w, 0] = JOINING, clock, self.n_pushes
        self.pushes[w], self.done[w] = clock, False
        self.n_done -= 1
        self.pulses[w] = Pulse(beat_path(self.door.port_file, w))

    def _drop(self, w: int, why: str, tell: bool = True) -> None:
        super()._drop(w, why, tell=False)
        self.awaiting.pop(w, None)
        if self.links.gone.get(w, 1) is None:   # never linked here: nothing to tell it
            del self.links.gone[w]

    def _primary_lost(self, why: str, started: float) -> str:
        record = {"server": "primary", "why": why, "updates": self.n_pushes,
                  "at_s": round(time.perf_counter() - started, 3), "segments": self.segments}
        self.lost_record.append(record)
        for path in self.segments:   # nothing of the killed job unlinks them
            try:
                os.unlink(path)
            except OSError:
                pass
        crc = zlib.crc32(self.versions.live.tobytes())
        self.trace.save("takeover.npy", np.array([self.n_pushes, crc], np.int64))
        return why

    def take_over(self, port: str) -> None:
        """Serve from now on at ``port`` (published by the caller); every live worker has
        5 x ``--stall-timeout`` to re-route here, with its slot."""
        self.following, self.door.port = False, port
        now = time.monotonic()
        self.awaiting = {w: now for w in range(self.W) if self.state[w] in (JOINING, LIVE)}
        self.empty_since = now
        door, self.standby_door = self.standby_door, None
        if door is not None:
            door.close()   # its port file and any knock left
        for w, inter in self.standby.items():   # welcomed now: no accept after the death
            if w in self.awaiting and not self.pulses[w].dead():
                self._welcome_back(w, inter, "its standby link")
                self.welcomed.add(w)

    def _between(self) -> bool:
        changed = super()._between()
        now = time.monotonic()
        for w, since in list(self.awaiting.items()):
            if self.pulses[w].dead():
                self._drop(w, "its process ended before it re-routed to the backup")
                changed = True
            elif now - since > self.links.silence_s * 5:
                self._drop(w, f"it did not re-route to the backup within "
                              f"{self.links.silence_s * 5:g} s")
                changed = True
        if self.awaiting:
            self.empty_since = now   # its workers are still on their way
        return changed

    def _serving(self) -> bool:
        return super()._serving() or bool(self.awaiting)

    def _admit(self, ready: str) -> None:
        if not ready.startswith(REROUTE):
            return super()._admit(ready)
        w = int(ready[len(REROUTE):].split("-", 1)[0])
        inter = self.door.admit(ready)
        if self.door.void:   # it died before it connected: its slot stays awaited
            return
        if w in self.welcomed and self.state[w] in (JOINING, LIVE):
            self.welcomed.discard(w)   # its welcome did not reach it over the standby link
            self.links.drop(w)
            self.awaiting[w] = time.monotonic()
        if w not in self.awaiting:
            self._send_welcome(inter, {"refused": f"slot {w} is not awaited here (it was "
                                                  f"dropped, or the run is over)"})
            return
        self._welcome_back(w, inter, "a connection after the takeover")

    def _welcome_back(self, w: int, inter: MPI.Intercomm, how: str) -> None:
        """Worker ``w`` goes on here over ``inter``, from the clock this backup holds for it."""
        clock = int(self.pushes[w])
        self._send_welcome(inter, {**self.welcome(w, clock), "slot": w, "clock": clock})
        del self.awaiting[w]
        self.links.add(w, inter)
        self.event("rerouted", worker=w, clock=clock, updates=self.n_pushes, how=how)

    def replicas(self) -> dict:
        return {"replicas": 2, "servers_lost": self.lost_record}

