"""The elastic server: psgd's parameter-server loop over joined workers, who may come and go.

:class:`ElasticServer` is :mod:`psgd.ps.server`'s loop and update rule, with
:class:`psgd.elastic.links.Links` as its communicator. Between messages it admits the
workers that knock (:mod:`psgd.elastic.door`), and drops a worker silent longer than the
stall timeout (one whose pull the ssp or bsp bound holds waits on the servers: its silence
counts from the answer). The version, and so the bound and bsp's average, count the live
workers only. The run ends when the servers have applied the run's updates, counted here,
or when no worker has been connected for the no-worker timeout.
"""
from __future__ import annotations

import json
import time

import numpy as np
from mpi4py import MPI

from psgd.elastic.alive import BEAT_S, Pulse, beat_path
from psgd.elastic.links import Links, WorkerLost
from psgd.elastic.peers import ADMIT, DROP, END, Peers
from psgd.errors import PsgdError
from psgd.ps.messages import DROPPED, OVER, PULL, TAG_CTRL, server_pull
from psgd.ps.server import _Server

TAG_WELCOME = 7201
FREE, JOINING, LIVE, DONE, LOST = "free", "joining", "live", "done", "lost"
HOLD_S = 4 * BEAT_S   # a worker whose beat is still this long gets no reply until it moves


class ElasticServer(_Server):
    """Serve one shard to whoever is connected until ``updates`` pushes are applied.

    Parameters
    ----------
    roles : psgd.mpi.roles.Roles
        ``comm`` a :class:`Links`; ``n_workers`` its slots (each join takes one).
    door : psgd.elastic.door.Door
        Where joiners knock.
    welcome : callable
        ``welcome(slot, clock) -> dict``: what a new worker is told (settings, run id).
    updates : int
        The run's length: pushes applied over all workers.
    start_updates : int
        The pushes applied before (a resumed run's checkpoint step).
    no_worker_s : float
        The run ends (abandoned) after this long without a connected worker.
    event : callable
        ``event(kind, **fields)``: a join, a loss, a worker done, the end (logged by the job).
    stopped : callable
        ``stopped() -> str``: why to end the run now (a stop signal), or "".
    log_every : int
        A ``step`` event every this many updates.
    """

    def __init__(self, roles, shard_map, config, init_shard, init_opt_state, on_snapshot,
                 start_clock, *, door, welcome, updates: int, no_worker_s: float,
                 event, stopped, log_every: int = 20, start_updates: int = 0) -> None:
        super().__init__(roles, shard_map, config, init_shard, init_opt_state, on_snapshot,
                         start_clock)
        self.links: Links = roles.comm
        self.peers, self.lead = Peers(self.links.comm), self.rank == 0
        self.door, self.welcome, self.event, self.stopped = door, welcome, event, stopped
        door.stand_in = True   # a joiner that dies while it is accepted is dropped, not fatal
        self.joiners: list = [None] * self.W   # rank 0: each joiner's process (door.Joiner)
        self.updates, self.no_worker_s = int(updates), float(no_worker_s)
        self.done[:] = True          # a slot counts in the version only while its worker is in
        self.n_done = self.W
        self.state = [FREE] * self.W
        self.first = np.zeros(self.W, np.int64)     # the clock each worker started at
        self.span = np.full((self.W, 2), -1, np.int64)   # updates applied when it came, left
        self.data_reqs: list = [None] * self.W      # each worker's reply in flight
        self.pulses: list = [None] * self.W         # each worker's beat (psgd.elastic.alive)
        self.next_look = 0.0                        # when to look at the beats again
        self.sent: list = []                        # welcome messages (buffer, request)
        self.over, self.abandoned = False, False
        self.empty_since = time.monotonic()
        self.log_every, self.logged = max(int(log_every), 1), int(start_updates)
        self.n_pushes = int(start_updates)   # a resumed run counts on from its checkpoint
        # the compensation counts a slot from its join (dana's N); a resumed run's joiners take
        # the slots whose state the checkpoint carried first (rank 0 picks the slots)
        self.carried = self.rule.carried()
        self.rule.vacate()

    # ------------------------------------------------------------ the loop's hooks

    def _describe(self) -> str:
        if not self.links.live:
            return (f"a worker to join (none connected; the run ends after "
                    f"{self.no_worker_s:g} s without one, --no-worker-timeout)")
        return super()._describe()

    def _serving(self) -> bool:
        return not self.over or bool(self.links.live) or bool(self.snapshots.assembling)

    def _between(self) -> bool:
        changed = self._follow()
        self._tell_gone()
        if self.lead:
            ready, lapsed = self.door.look()
            if ready is not None:
                self._admit(ready)
                changed = True
            if lapsed is not None:
                self.event("refused", why=f"the joiner {lapsed} did not answer its turn (its "
                                          f"process ended, or {self.door.accept_s:g} s passed)")
            while self.door.refused:   # another run's joiner: told, never connected
                self.event("refused", why=self.door.refused.pop(0))
        now = time.monotonic()
        look, held = now >= self.next_look, {dest - self.S for dest, _, _ in self.pending}
        if look:
            self.next_look = now + BEAT_S
        for w in list(self.links.live):
            why = self._lost(w, now - self.links.heard[w], w in held, look)
            if why:
                self._drop(w, why)
                changed = True
        if self.lead:
            self._lead_end(now)
        return changed

    def _lost(self, w: int, silent: float, held: bool, look: bool) -> str:
        """Why live worker ``w`` is lost ("" while it is not): its process ended (looked at
        when ``look``), or it was silent too long; a worker whose pull the servers hold waits
        on them, so only a beat that stopped moving counts then."""
        pulse = self.pulses[w]
        if look and pulse.dead():
            return "its process ended"
        if held:
            quiet = pulse.quiet_s()
            return (f"its beat stood still for {quiet:.1f} s while its pull waited "
                    f"(--stall-timeout {self.links.silence_s:g})"
                    if quiet > self.links.silence_s else "")
        if self.state[w] == JOINING and silent > self.no_worker_s:
            return f"sent nothing for {silent:.0f} s after joining"
        if self.state[w] == LIVE and silent > self.links.silence_s:
            return f"silent for {silent:.1f} s (--stall-timeout {self.links.silence_s:g})"
        return ""

    def _lead_end(self, now: float) -> None:
        """Server rank 0 ends the run on a stop signal or after the no-worker timeout."""
        if not self.over and self.stopped():
            self._end(self.stopped())
        if self.links.live:
            self.empty_since = now
        elif not self.over and now - self.empty_since > self.no_worker_s:
            self.abandoned = True
            self._end(f"no worker connected for {self.no_worker_s:g} s (--no-worker-timeout)")

    def _tell_gone(self) -> None:
        """A dropped worker that was slow, not dead: its messages are taken and discarded,
        and its next pull is answered with ``DROPPED`` (it then leaves with one line)."""
        for w, inter in list(self.links.gone.items()):
            if self.pulses[w].dead():   # nothing to tell, and a send to it could crash MPICH
                del self.links.gone[w]
                continue
            if self.pulses[w].quiet_s() > HOLD_S:
                continue
            while (msg := inter.Improbe(0, MPI.ANY_TAG, self.status)) is not None:
                tag = self.status.Get_tag()
                buf = np.empty(max(self.status.Get_count(MPI.BYTE), 8), np.uint8)
                msg.Recv(buf)
                if tag == TAG_CTRL and buf.view(np.int64)[0] == PULL:
                    hdr = np.array([-1, 0, self.version, DROPPED, 0], np.int64)
                    data = self.versions.live.copy()
                    self.sent.append(((hdr, data), server_pull(inter, 0, hdr, data)))
                    del self.links.gone[w]
                    break

    def _follow(self) -> bool:
        """Do what the other servers said: accept rank 0's joiner, drop a worker, end."""
        notes = self.peers.heard()
        for kind, w, clock, rank in notes:
            if kind == ADMIT:
                inter = self.door.admit(None)
                if w >= 0:
                    self._take(w, clock, inter)
            elif kind == DROP and self.state[w] in (JOINING, LIVE):
                self._drop(w, f"server rank {rank} found it lost", tell=False)
            elif kind == END and not self.over:
                self.abandoned = bool(clock)
                self._end("server rank 0 ended the run", tell=False)
        return bool(notes)

    def _control(self, msg: MPI.Message, status: MPI.Status) -> None:
        w = status.Get_source() - self.S
        try:
            super()._control(msg, status)
        except WorkerLost as lost:   # its push's header came, its payload never did
            if lost.aside is not None:   # a receive left pending: its buffer is set aside
                self._renew(lost.aside)
            self._drop(lost.w, "its push's payload never came (the push is discarded)")
            return
        except PsgdError as exc:     # a worker that breaks the protocol leaves, not the run
            self._drop(w, f"refused: {exc}")
            return
        if self.state[w] == JOINING:
            self.state[w] = LIVE
        if self.done[w] and self.state[w] == LIVE:
            self.state[w] = DONE
            self.span[w, 1] = self.n_pushes
            self.links.drop(w)
            self.event("left", worker=w, **self._tally(w), how="done")
        if self.n_pushes % self.log_every == 0 and self.n_pushes > self.logged:
            self.logged = self.n_pushes
            self.event("step", updates=self.n_pushes, version=self.version,
                       live=len(self.links.live))
        if self.lead and not self.over and self.n_pushes >= self.updates:
            self._end(f"{self.n_pushes} updates applied")

    def _renew(self, aside: np.ndarray) -> None:
        """A new buffer in place of ``aside``, into which a lost worker's receive is pending."""
        if self.frame is not None and np.shares_memory(aside, self.frame):
            self.frame = np.zeros_like(self.frame)
        else:
            self.rule.renew_receive_buffer()

    def _answer_pulls(self) -> None:
        """Answer no worker that may be dead: MPICH can crash a process that sends to a peer
        dead for seconds. A worker whose process ended is dropped first; one whose beat stands
        still (another host) keeps its pull until the beat moves or it is dropped."""
        for dest, _, _ in list(self.pending):
            w = dest - self.S
            if self.state[w] in (JOINING, LIVE) and self.pulses[w].dead():
                self._drop(w, "its process ended (seen before answering its pull)")
        quiet = [p for p in self.pending if self.pulses[p[0] - self.S].quiet_s() > HOLD_S]
        self.pending = [p for p in self.pending if p not in quiet]
        super()._answer_pulls()
        self.pending += quiet

    def _reply(self, dest: int, w: int, clock: int, since: float, now: float) -> None:
        reqs = self.versions.reqs[self.versions.index]
        before = len(reqs)
        super()._reply(dest, w, clock, since, now)
        self.data_reqs[w] = reqs[-1] if len(reqs) > before else None
        self.links.heard[w] = time.monotonic()   # its silence counts from the answer

    # ------------------------------------------------------------ joins, losses, the end

    def _admit(self, ready: str) -> None:
        """Rank 0: accept the joiner that answered its turn (with every server), and welcome
        it: a slot, the clock it starts at, the run's settings; or refuse it."""
        w = self._free_slot()
        clock = self.version
        self.peers.tell(ADMIT, w, clock)
        inter = self.door.admit(ready)
        joiner = self.door.joiners.pop(ready, None)
        if self.door.void:   # it died before it connected: a stand-in of ours took the accept
            if w >= 0:
                self._take(w, clock, inter, joiner)
                self._drop(w, "it died while it was being admitted, before it connected")
            return
        if w < 0:
            why = ("the run is over" if self.over else
                   f"all {self.W} slots were taken (--max-workers)")
            self._send_welcome(inter, {"refused": why})
            self.event("refused", why=why)
            return
        self._send_welcome(inter, {**self.welcome(w, clock), "slot": w, "clock": clock})
        self._take(w, clock, inter, joiner)

    def _free_slot(self) -> int:
        """The slot a joiner gets (-1: none, or the run is over): one whose state a resumed
        checkpoint carried first (dana's velocity of a worker live then), else the first free."""
        free = [w for w in self.carried if self.state[w] == FREE] + [
            w for w, state in enumerate(self.state) if state == FREE]
        return free[0] if free and not self.over else -1

    def _take(self, w: int, clock: int, inter: MPI.Intercomm, joiner=None) -> None:
        """Worker ``w`` joined over ``inter`` and starts at ``clock`` (``joiner``: its process
        as its knock named it, watched before it beats: psgd.elastic.door.Joiner)."""
        self.state[w], self.first[w], self.span[w, 0] = JOINING, clock, self.n_pushes
        self.pushes[w], self.done[w] = clock, False
        self.n_done -= 1
        self.rule.worker_joined(w)
        self.pulses[w] = Pulse(beat_path(self.door.port_file, w))
        if joiner is not None and joiner.place is not None:
            self.pulses[w].who, self.joiners[w] = (joiner.place, joiner.pid), joiner
        self.links.add(w, inter)
        self.event("joined", worker=w, clock=clock, updates=self.n_pushes)

    def _send_welcome(self, inter: MPI.Intercomm, message: dict) -> None:
        buf = np.frombuffer(json.dumps(message).encode(), np.uint8).copy()
        self.sent.append((buf, inter.Isend(buf, 0, TAG_WELCOME)))   # kept: the worker may die

    def _drop(self, w: int, why: str, tell: bool = True) -> None:
        """Declare worker ``w`` lost: nothing of it is applied or awaited any more (``tell``:
        and the other servers drop it too)."""
        if tell:
            self.peers.tell(DROP, w)
        self.state[w] = LOST
        self.span[w, 1] = self.n_pushes
        self.links.drop(w, lost=True)
        self.pending = [p for p in self.pending if p[0] != self.S + w]
        dead = self.data_reqs[w]
        if dead is not None:   # its reply may never be received: not waited on
            for reqs in self.versions.reqs:
                reqs[:] = [r for r in reqs if r is not dead]
        if self.joiners[w] is not None:   # a SIGKILLed job's MPICH segment: unlinked here
            self.joiners[w].tidy()
        self.data_reqs[w], self.hdr_reqs[w] = None, None
        self.order.done(w)
        self.rule.worker_lost(w)   # and the compensation's replies to it are not awaited
        self.done[w] = True
        self.n_done += 1
        self.event("lost", worker=w, **self._tally(w), why=why)
        self._update_version()

    def _tally(self, w: int) -> dict:
        return {"first_clock": int(self.first[w]), "last_clock": int(self.pushes[w]) - 1,
                "pushes": int(self.pushes[w] - self.first[w]), "updates": self.n_pushes}

    def _end(self, why: str, tell: bool = True) -> None:
        """From now on every pull is answered with the final parameters and ``OVER``."""
        if tell:
            self.peers.tell(END, clock=int(self.abandoned))
        self.over = True
        self.reply_shard = OVER
        self.event("end", why=why, updates=self.n_pushes, abandoned=self.abandoned)
        self._answer_pulls()

    def roster(self) -> list[dict]:
        """Every slot that was taken: its state, pushes, and the updates applied when it
        joined and when it left (-1: it did not)."""
        return [{"worker": w, "state": self.state[w], **self._tally(w),
                 "joined_at": int(self.span[w, 0]), "left_at": int(self.span[w, 1])}
                for w in range(self.W) if self.state[w] != FREE]
