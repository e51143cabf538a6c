"""The parameter-server loop of bsp, ssp and asp: serve one shard until every worker is done.

Control messages (push, pull, done; :mod:`psgd.ps.messages`) are handled in
arrival order.  A push goes to the protocol's update rule; a pull for clock c
is answered once the shard's version v >= c - s (the staleness bound); v is
the fewest pushes any unfinished worker has made.  docs/design/parameter-server.md
gives the message flow and the server's memory bound.
"""
from __future__ import annotations

import math
import time

import numpy as np
from mpi4py import MPI

from psgd.compress import make as make_compressor
from psgd.config import ProtocolConfig
from psgd.errors import NonFinitePush, PsgdError
from psgd.mpi import faults, timeline
from psgd.mpi import wait as _wait
from psgd.mpi.phase import phase
from psgd.mpi.report import ServerResult, StalenessHistogram
from psgd.mpi.roles import Roles
from psgd.mpi.shardmap import ShardMap
from psgd.nn.optim import make_optimizer
from psgd.ps.adaptive import AdaptiveBound
from psgd.ps.messages import (DONE, HEADER_BYTES, HEADER_LEN, KIND_NAMES, PULL, PUSH,
                              PUSH_CODED, PUSH_WINDOW, REPLY_LEN, TAG_CTRL, TAG_SNAP,
                              check_ps_setup, check_push_shard, reply_momentum, server_pull,
                              server_push, server_push_coded)
from psgd.ps.order import Order, Recorder, Replay
from psgd.ps.push_window import PushWindow
from psgd.ps.snapshots import Snapshots
from psgd.ps.versions import ShardVersions, step_into

# Deferred work (the bsp rule's check of a push no pass has read yet) waits until the
# loop has found nothing to do for this long: one failed probe does not mean the next
# push is not already here (MPICH may need several polls to surface it).
IDLE_WORK_S = 2e-3


def _warm_up(config) -> None:
    """Load the update rule's and the optimizer's jitted kernels now, not inside the timed loop."""
    rule = config.update_rule
    warm_opt = make_optimizer(config.optimizer, 0, **config.opt_hparams)
    warm = rule(config, warm_opt, ShardVersions(np.zeros(0, np.float32)))
    for _ in range(3):  # bsp: the second push is added when the third arrives
        warm.push(warm.receive_buffer(), 0, 0, 0)
    warm.idle()
    warm.advance(0, 1)   # bsp: the step reads the sum and the third push
    empty = np.zeros(0, np.float32)
    for grad2 in (None, empty):   # the step while a reply reads (bsp: on two pushes)
        step_into(warm_opt, empty, empty, empty.copy(), 0.0, grad2=grad2)


class _Server:
    def __init__(self, roles, shard_map, config, init_shard, init_opt_state, on_snapshot,
                 start_clock):
        self.comm = roles.comm
        self.rank = roles.rank
        self.S, self.W = roles.n_servers, roles.n_workers
        self.shard = roles.server_index
        self.shard_map = shard_map
        self.config = config
        self.n = shard_map.size(self.shard)
        self.versions = ShardVersions(np.zeros(self.n, np.float32) if init_shard is None else
                                      shard_map.own(init_shard, self.shard, "initial shard").copy())
        self.optimizer = make_optimizer(config.optimizer, self.n, **config.opt_hparams)
        if init_opt_state is not None:
            self.optimizer.load_state_dict(self._own(init_opt_state, self.optimizer.state_keys))
        _warm_up(config)
        self.rule = config.update_rule(config, self.optimizer, self.versions, n_workers=self.W)
        if init_opt_state is not None:
            self.rule.load_state(self._own(init_opt_state, self.rule.state()))
        if config.replayed_before is not None:
            self.rule.recount(config.replayed_before[self.shard])
        self.bound = float(config.staleness)
        self.adaptive = None   # --staleness auto: the bound in force is set online
        if config.staleness_auto:
            self.adaptive = AdaptiveBound(self.W, int(config.staleness))
            self.bound = float(self.adaptive.bound)
        self.pushes = np.full(self.W, int(start_clock), np.int64)
        self.done = np.zeros(self.W, bool)
        self.n_done = 0   # done.sum(), read on every poll of the loop
        self.version = int(start_clock)
        self.pending: list[tuple[int, int, float]] = []    # (worker rank, clock, since)
        self.reply_hdr = np.zeros((self.W, REPLY_LEN), np.int64)
        self.hdr_reqs: list = [None] * self.W
        self.hist = StalenessHistogram()
        self.n_pushes = 0
        self.n_skipped = 0
        self.snapshots = Snapshots(self.comm, shard_map, self.shard, self.optimizer, on_snapshot,
                                   self.rule)
        self.ctrl = np.zeros(HEADER_LEN, np.int64)
        self.status = MPI.Status()
        # collective with the workers' PSWorker.start (every rank of the job makes it)
        self.window = PushWindow(self.comm, 0) if config.push_window else None
        self.segments: dict[int, np.ndarray] = {}   # worker rank -> its shard slice in the window
        self.n_window_pushes = 0
        self.fault = faults.for_rank(self.rank)  # None unless PSGD_X_FAULT names this rank (tests)
        events = config.replay_events
        self.order = (Replay(events[self.shard], self.shard) if events is not None
                      else Recorder() if config.recording.record else Order())
        coding = config.compression
        self.compressor = make_compressor(coding.compress, coding.compress_bucket)
        self.frame = (np.zeros(self.compressor.max_bytes(self.n), np.uint8)
                      if self.compressor is not None else None)
        self.push_bytes = 0   # control header and payload of every push, as received
        self.reply_shard = self.shard   # a reply's shard field (messages.OVER: the run is over)

    # ------------------------------------------------------------ the loop

    def _describe(self) -> str:
        held = ", ".join(f"rank {r} clock {c}" for r, c, _ in self.pending) or "none"
        running = [w for w in range(self.W) if not self.done[w]]
        if not running:
            return (f"the other servers' snapshots of clocks {sorted(self.snapshots.assembling)} "
                    f"(shard {self.shard})")
        if self.order.replaying:
            return f"{self.order.describe()} (shard {self.shard}, held pulls: {held})"
        slowest = [self.S + w for w in running if self.pushes[w] == self.version]
        return (f"worker rank(s) {slowest} to push clock {self.version} of shard {self.shard} "
                f"(held pulls: {held}; unfinished worker ranks {[self.S + w for w in running]}"
                f"; snapshots assembling: {sorted(self.snapshots.assembling)})")

    def _own(self, state: dict, keys) -> dict:
        """``state`` with its per-element arrays ``keys`` (those it has) cut to this shard: a
        resumed run's state may hold the shard's or the full length."""
        own = self.shard_map.own
        return {**state, **{key: own(state[key], self.shard, f"optimizer state {key!r}")
                            for key in keys if key in state}}

    def run(self) -> ServerResult:
        comm, status = self.comm, self.status
        snapshots_in = self.rank == 0 and self.config.snapshot_every > 0 and self.S > 1
        wall0, cpu0 = time.perf_counter(), time.process_time()
        poller = _wait.Poller(self._describe)
        tl, idle_since = timeline.current, wall0
        while self._serving():
            msg = comm.Improbe(self.order.source(self.S), TAG_CTRL, status)
            if msg is not None:
                t0 = time.perf_counter()
                self._control(msg, status)
                poller = _wait.Poller(self._describe)
                if tl is not None:
                    idle_since = self._span(tl, idle_since, t0)
                continue
            if snapshots_in:
                msg = comm.Improbe(MPI.ANY_SOURCE, TAG_SNAP, status)
                if msg is not None:
                    t0 = time.perf_counter()
                    self.snapshots.receive(msg, status)
                    poller = _wait.Poller(self._describe)
                    if tl is not None:
                        idle_since = self._span(tl, idle_since, t0, "snapshot")
                    continue
            self.versions.reap()
            if self._between():
                poller = _wait.Poller(self._describe)
            if poller.waited() > IDLE_WORK_S:
                self.rule.idle()
            poller.idle()
        if tl is not None:
            tl.span("idle", idle_since, time.perf_counter())
        outstanding = (self.versions.all_requests() + self.rule.requests()
                       + [r for r in self.hdr_reqs if r is not None])
        if self.snapshots.request is not None:
            outstanding.append(self.snapshots.request)
        _wait.waitall(outstanding, "workers and rank 0 to receive this server's last messages")
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        result = ServerResult(staleness_hist=self.hist.counts,
                              n_pushes=self.n_pushes, n_updates=self.rule.n_updates,
                              n_skipped=self.n_skipped, n_window_pushes=self.n_window_pushes,
                              n_in_place=self.versions.n_in_place,
                              n_version_waits=self.versions.n_waits,
                              cpu_s=cpu, wall_s=wall,
                              n_snapshots=self.snapshots.n_snapshots,
                              compensation=self.rule.compensation(),
                              bound_history=(self.adaptive.history if self.adaptive else None),
                              buffer_bytes=self._buffer_bytes(), events=self.order.events(),
                              push_bytes=self.push_bytes)
        with phase("gathering the final shards"):
            result.params, result.opt_state = self.snapshots.gather_final(self.version,
                                                                          self.versions.live)
        if self.window is not None:
            self.window.free()
        return result

    def _serving(self) -> bool:
        """Whether the loop goes on: a worker is not done, or a snapshot is assembling."""
        return self.n_done < self.W or bool(self.snapshots.assembling)

    def _between(self) -> bool:
        """Work between messages when none is waiting; True when the set of workers changed
        (an elastic server admits and drops workers here, :mod:`psgd.elastic.server`)."""
        return False

    def _span(self, tl, idle_since: float, t0: float, kind: str | None = None) -> float:
        """The message just handled (from ``t0``) and the idle gap before it, as timeline spans."""
        t1 = time.perf_counter()
        if t0 - idle_since > timeline.IDLE_MIN_S:
            tl.span("idle", idle_since, t0)
        if kind is not None:
            tl.span(kind, t0, t1)
        elif int(self.ctrl[0]) in (PUSH, PUSH_WINDOW, PUSH_CODED):
            tl.span("apply", t0, t1, int(self.ctrl[1]), int(self.ctrl[1] - self.ctrl[2]))
        else:
            tl.span("reply", t0, t1, int(self.ctrl[1]))
        return t1

    def _buffer_bytes(self) -> int:
        arrays = self.versions.buffers + self.rule.buffers() + self.snapshots.state_arrays()
        return sum(a.nbytes for a in arrays)

    def _control(self, msg: MPI.Message, status: MPI.Status) -> None:
        source = status.Get_source()
        nbytes = status.Get_count(MPI.BYTE)
        if nbytes != 8 * HEADER_LEN:
            msg.Recv(np.empty(max(nbytes, 1), np.uint8))
            raise PsgdError(f"control message from rank {source} has {nbytes} bytes, expected "
                            f"{8 * HEADER_LEN} (int64[{HEADER_LEN}] header)")
        msg.Recv(self.ctrl)
        kind, clock = int(self.ctrl[0]), int(self.ctrl[1])
        if source < self.S:
            raise PsgdError(f"server rank {self.rank} got a {KIND_NAMES.get(kind, kind)} message "
                            f"from rank {source}, which is a server, not a worker")
        w = source - self.S
        if self.done[w]:
            raise PsgdError(f"rank {source} sent a {KIND_NAMES.get(kind, kind)} message after "
                            f"saying it was done")
        if kind in (PUSH, PUSH_WINDOW, PUSH_CODED):
            self._push(source, w, clock, int(self.ctrl[2]), kind)
        elif kind == PULL:
            if int(self.ctrl[3]) != self.shard:
                raise PsgdError(f"pull from rank {source} names shard {int(self.ctrl[3])}, but it "
                                f"reached server rank {self.rank} which holds shard {self.shard}")
            now = time.perf_counter()
            if self.adaptive is not None:   # the bound changes here only, outside _answer_pulls
                self.bound = float(self.adaptive.pulled(clock, self.version, now))
            self.pending.append((source, clock, now))
            self._answer_pulls()
        elif kind == DONE:
            self.order.done(w)
            self.rule.worker_done(w)
            self.done[w] = True
            self.n_done += 1
            self._update_version()
        else:
            raise PsgdError(f"message of unknown kind {kind} from rank {source}")

    def _push(self, source: int, w: int, clock: int, read_version: int, kind: int) -> None:
        in_window = kind == PUSH_WINDOW
        if in_window:   # lent: read in place, never written (it is the worker's memory)
            buf = self._window_slice(source, clock)
            self.n_window_pushes += 1
            self.push_bytes += HEADER_BYTES + 4 * self.n
        elif kind == PUSH_CODED:
            if self.compressor is None:
                raise PsgdError(f"compressed push from rank {source}, but this server runs "
                                f"--compress none (it must be the same on every rank)")
            nbytes = server_push_coded(self.comm, source, self.ctrl, self.shard, self.frame)
            buf = self.rule.receive_buffer()
            buf.fill(0.0)
            self.compressor.decode_add(self.frame[:nbytes], buf,
                                       f"rank {source}'s push for clock {clock}")
            self.push_bytes += HEADER_BYTES + nbytes
        else:
            buf = self.rule.receive_buffer()
            server_push(self.comm, source, self.ctrl, self.shard, self.n, buf)
            self.push_bytes += HEADER_BYTES + 4 * self.n
        if self.fault is not None:
            self.fault.at(self.n_pushes, buf)
        if clock != self.pushes[w]:
            raise PsgdError(f"push from rank {source} is for clock {clock}, expected clock "
                            f"{int(self.pushes[w])} (clocks are pushed in order, once each)")
        if not 0 <= read_version <= self.version:
            raise PsgdError(f"push from rank {source} for clock {clock} claims it read version "
                            f"{read_version}, but shard {self.shard} is at version {self.version}")
        staleness = clock - read_version
        if staleness < 0:
            raise PsgdError(f"push from rank {source} for clock {clock} read version "
                            f"{read_version}, from its own future")
        self.order.pushed(w, clock)
        self.n_pushes += 1
        self.hist.add(staleness)
        if not self.rule.push(buf, clock, staleness, source, borrowed=in_window, worker=w):
            if not self.config.skip_nonfinite:
                raise NonFinitePush(source, clock)
            self.n_skipped += 1
        self.pushes[w] += 1
        if self.adaptive is not None:
            self.adaptive.pushed(w, time.perf_counter())
        self._update_version()

    def _window_slice(self, source: int, clock: int) -> np.ndarray:
        """This shard's slice of worker ``source``'s gradient in the push window (synced)."""
        check_push_shard(self.comm, source, self.ctrl, self.shard)
        grad = self.segments.get(source)
        if grad is None:
            where = f"push from rank {source} for clock {clock} is in the push window, but"
            if self.window is None:
                raise PsgdError(f"{where} this server has none (PSGD_X_PS_PUSH_WINDOW must be the "
                                f"same on every rank)")
            segment = self.window.segment(source)
            if segment is None:
                raise PsgdError(f"{where} rank {source} is on another node than server rank "
                                f"{self.rank}")
            if segment.shape[0] != self.shard_map.n:
                raise PsgdError(f"{where} its segment holds {segment.shape[0]} float32, not the "
                                f"{self.shard_map.n} of the parameter vector")
            grad = self.segments[source] = self.shard_map.view(segment, self.shard)
        self.window.sync()   # after the header, before the first read of the gradient
        return grad

    def _update_version(self) -> None:
        active = ~self.done
        if not active.any():
            return
        new = int(self.pushes[active].min())
        if new > self.version:
            old = self.version
            if not self.rule.advance(old, new):
                if not self.config.skip_nonfinite:
                    raise PsgdError(f"the sum of the workers' pushes for clock {old} overflowed "
                                    f"float32 on shard {self.shard}; lower the learning rate, or "
                                    f"pass --skip-nonfinite")
                self.n_skipped += 1
            self.version = new
            k = self.config.snapshot_every
            if k > 0:
                for c in range(old, new):
                    if (c + 1) % k == 0:  # after every k steps: clocks k-1, 2k-1, ...
                        if self.config.hold_at_snapshots:
                            self.rule.settle()
                        self.snapshots.capture(c, self.versions.live)
        self._answer_pulls()

    def _answer_pulls(self) -> None:
        """Answer every held pull the bound (or the replayed order) lets through."""
        answered = True
        while answered and self.pending:   # again after an answer: a replay may allow the next
            answered = False
            keep = []
            now = time.perf_counter()
            for dest, clock, since in self.pending:
                w = dest - self.S
                if answered and self.order.replaying or not self.order.may_answer(
                        w, clock, self.version >= clock - self.bound and not self._held(clock)):
                    keep.append((dest, clock, since))
                    continue
                self._reply(dest, w, clock, since, now)
                answered = True
            self.pending = keep

    def _held(self, clock: int) -> bool:
        """``config.hold_at_snapshots``: a pull for a snapshot's next clock waits for the
        snapshot (every worker's push of the clock before)."""
        k = self.config.snapshot_every
        return self.config.hold_at_snapshots and k > 0 and clock % k == 0 and self.version < clock

    def _reply(self, dest: int, w: int, clock: int, since: float, now: float) -> None:
        if self.hdr_reqs[w] is not None:
            _wait.wait(self.hdr_reqs[w], f"rank {dest} to take its previous reply header")
        self.order.replied(w, clock)
        bound = int(self.bound) if math.isfinite(self.bound) else -1
        self.reply_hdr[w, :4] = (bound, int((now - since) * 1e6), self.version, self.reply_shard)
        reply_momentum(self.reply_hdr)[w] = self.rule.worker_momentum()
        if self.adaptive is not None:
            self.adaptive.answered(w, now - since)
        params = self.rule.replied(w, clock, self.versions.live)
        hdr_req, data_req = server_pull(self.comm, dest, self.reply_hdr[w], params)
        self.hdr_reqs[w] = hdr_req
        if params is self.versions.live:
            self.versions.reply_sent(data_req)
        else:
            self.rule.reply_sent(w, clock, data_req)


def serve(roles: Roles, shard_map: ShardMap, config: ProtocolConfig,
          init_shard: np.ndarray | None = None, init_opt_state: dict | None = None,
          on_snapshot=None, start_clock: int = 0) -> ServerResult:
    """Serve this rank's shard under bsp/ssp/asp until every worker has sent done.

    Parameters
    ----------
    roles : Roles
        This rank must be a server (rank s serves shard s).
    shard_map : ShardMap
        S shards of ``config.n_params``.
    config : ProtocolConfig
        Protocol, optimizer, ``lr_schedule``, staleness bound, snapshots.
    init_shard : ndarray, float32 (shard size,) or (n,), optional
        Initial parameters of this shard (a full vector is sliced); zeros if None.
    init_opt_state : dict, optional
        Optimizer state to resume from: per-element arrays of the shard's or
        the full length (sliced), plus scalars.
    on_snapshot : callable, optional
        Rank 0 only: ``on_snapshot(clock=c, params=float32 (n,), opt_state=dict)``,
        called from the server loop when every shard's snapshot of clock c is in.
    start_clock : int
        First clock the workers compute (0, or the step a run resumes at).

    Returns
    -------
    ServerResult
        With the full ``params`` and ``opt_state`` on rank 0.

    Raises
    ------
    ValueError
        S = 0, a non-PS protocol, or this rank is not a server.
    PsgdError
        A malformed or out-of-order message, or a non-finite push (unless
        ``config.skip_nonfinite``).
    """
    check_ps_setup(roles, shard_map, config)
    if not roles.is_server:
        raise ValueError(f"rank {roles.rank} is a worker; serve runs on server ranks")
    t0 = time.perf_counter()
    server = _Server(roles, shard_map, config, init_shard, init_opt_state, on_snapshot,
                     start_clock)
    if timeline.current is not None:
        timeline.current.span("start", t0, time.perf_counter(), start_clock)
    return server.run()
