"""The parameter-server loop shared by bsp, ssp and asp: serve one shard until every worker is done.

Each server rank s owns shard s of the flat vector (:class:`psgd.mpi.shardmap.ShardMap`)
and its optimizer state.  It polls for control messages from any worker
(:mod:`psgd.ps.messages` has the layout) without spinning (``Improbe`` with
:mod:`psgd.mpi.wait`'s backoff) and handles them in arrival order:

* push for clock c read at version v: received (or, from a worker of this
  node, read in place from its segment of the push window,
  :mod:`psgd.ps.push_window`), validated (sender is a worker, shard id,
  payload length, clocks in order, v <= current version), staleness c - v
  recorded, then handed to the protocol's update rule
  (:class:`psgd.ps.bsp.BspUpdate`: sum, then one mean step when the
  version advances; :class:`psgd.ps.ssp.SspUpdate`: one step now),
  which checks it for NaN/Inf in a pass that reads it anyway (bsp defers
  the check to the add or the step, or to when the server has idled 2 ms); a
  non-finite push ends the job naming its sender, or is skipped and counted
  with ``skip_nonfinite``.
* the step updates the live shard in place, or writes the next version into
  a spare buffer while a pull reply still reads the live one
  (:class:`psgd.ps.versions.ShardVersions`): pull replies are sent straight
  from the live buffer, which is never written while replies read it.
* pull for clock c: answered when the version v >= c - s (s = 0 for bsp, the
  bound for ssp, inf for asp); otherwise held until a push advances v.
* done: the worker no longer counts towards the version.

Version v = min over unfinished workers of the pushes received from each (all
have pushed clocks 0..v-1); staleness of a push = its clock - the version it
read.  So bsp and ssp(0) never see staleness > 0, and ssp(s) never above s.

Snapshots (``config.snapshot_every = k > 0``): when v passes clock c with
(c + 1) % k == 0 (k, 2k, ... steps done), each server sends its shard params
+ per-element optimizer state (one buffer, non-blocking) to rank 0, which
keeps serving while it assembles them (:mod:`psgd.ps.assembly`) and calls
``on_snapshot(clock=c, params=..., opt_state=...)`` when all S shards of c are
in.  Under bsp that is exactly the state after the step of clock c.

Memory bound per server, whatever W: the live shard params + optimizer state
(k arrays) + ``shard_versions.SPARES`` (2) spare version buffers + one receive
buffer + a second sum buffer (bsp only), all float32 of the shard's length:
(4 + k) shard lengths under ssp/asp, (5 + k) under bsp (reported as
``ServerResult.buffer_bytes``), plus one snapshot buffer of (1 + k) shard
lengths when snapshots are on; plus O(W) integers (push counts, one pending
pull and one 32-byte reply header per worker; a worker has at most one pull
outstanding, with or without overlap).  Receive buffers do not grow with W:
pushes are received one at a time into the one buffer, and a pull reply is
sent from the live version (no copy per reply).  Rank 0 also holds the full
vector and state ((1 + k) n floats) for each snapshot being assembled and for
the final gather.  The push window adds nothing on a server: the segments it
reads are the workers' gradient buffers, allocated by the workers.
"""
from __future__ import annotations

import time
import numpy as np
from mpi4py import MPI

from psgd.mpi import faults
from psgd.mpi import wait as _wait
from psgd.errors import NonFinitePush, PsgdError
from psgd.nn.optim import make_optimizer
from psgd.config import ProtocolConfig
from psgd.ps.push_window import PushWindow
from psgd.ps.messages import (DONE, HEADER_LEN, KIND_NAMES, PULL, PUSH, PUSH_WINDOW, REPLY,
                           TAG_CTRL, TAG_FINAL, TAG_SNAP, _mprobe, check_ps_setup,
                           check_push_shard, pack_shard_state, server_pull, server_push,
                           unpack_shard_state)
from psgd.mpi.report import ServerResult, StalenessHistogram
from psgd.mpi.roles import Roles
from psgd.ps.assembly import Assembly
from psgd.ps.versions import ShardVersions, step_into
from psgd.mpi.shardmap import ShardMap

# Deferred work (the bsp rule's check of a push no pass has read yet) waits until the
# loop has found nothing to do for this long.  One failed probe does not mean the next
# push is not already here (MPICH may need several polls to surface it), and a check
# run then delays it by a pass over the shard: bench_ps bsp, alternating with running
# it at the first failed probe, +7-42 % with 1 server (6 pairs), +10-13 % with 2 (3).
IDLE_WORK_S = 2e-3


class _Server:
    def __init__(self, roles, shard_map, config, init_shard, init_opt_state, on_snapshot,
                 start_clock):
        self.comm = roles.comm
        self.rank = roles.rank
        self.S, self.W = roles.n_servers, roles.n_workers
        self.shard = roles.server_index
        self.shard_map = shard_map
        self.config = config
        self.on_snapshot = on_snapshot
        self.n = shard_map.size(self.shard)
        self.versions = ShardVersions(np.zeros(self.n, np.float32) if init_shard is None else
                                      shard_map.own(init_shard, self.shard, "initial shard").copy())
        self.optimizer = make_optimizer(config.optimizer, self.n, **config.opt_hparams)
        self.state_keys = tuple(self.optimizer.state_keys)
        if init_opt_state is not None:
            self.optimizer.load_state_dict({**init_opt_state, **{
                key: shard_map.own(init_opt_state[key], self.shard, f"optimizer state {key!r}")
                for key in self.state_keys}})
        # load the jitted kernels now, not inside the timed loop
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
        self.rule = rule(config, self.optimizer, self.versions)
        self.bound = float(config.staleness)
        self.pushes = np.full(self.W, int(start_clock), np.int64)
        self.done = np.zeros(self.W, bool)
        self.n_done = 0   # done.sum(), read on every poll of the loop
        self.version = int(start_clock)
        self.pending: list[tuple[int, int, float]] = []    # (worker rank, clock, since)
        self.reply_hdr = np.zeros((self.W, HEADER_LEN), np.int64)
        self.hdr_reqs: list = [None] * self.W
        self.hist = StalenessHistogram()
        self.n_pushes = 0
        self.n_skipped = 0
        self.n_snapshots = 0
        self.snap_req = None
        self.snap_buf = None
        self.assembly: dict[int, Assembly] = {}   # rank 0: snapshots being put together
        self.ctrl = np.zeros(HEADER_LEN, np.int64)
        self.status = MPI.Status()
        # collective with the workers' PSWorker.start (every rank of the job makes it)
        self.window = PushWindow(self.comm, 0) if config.push_window else None
        self.segments: dict[int, np.ndarray] = {}   # worker rank -> its shard slice in the window
        self.n_window_pushes = 0
        self.fault = faults.for_rank(self.rank)  # None unless PSGD_FAULT names this rank (tests)

    # ------------------------------------------------------------ the loop

    def _describe(self) -> str:
        held = ", ".join(f"rank {r} clock {c}" for r, c, _ in self.pending) or "none"
        running = [w for w in range(self.W) if not self.done[w]]
        if not running:
            return (f"the other servers' snapshots of clocks {sorted(self.assembly)} "
                    f"(shard {self.shard})")
        slowest = [self.S + w for w in running if self.pushes[w] == self.version]
        return (f"worker rank(s) {slowest} to push clock {self.version} of shard {self.shard} "
                f"(held pulls: {held}; unfinished worker ranks {[self.S + w for w in running]}"
                f"; snapshots assembling: {sorted(self.assembly)})")

    def run(self) -> ServerResult:
        comm, status = self.comm, self.status
        snapshots_in = self.rank == 0 and self.config.snapshot_every > 0 and self.S > 1
        wall0, cpu0 = time.perf_counter(), time.process_time()
        poller = _wait.Poller(self._describe)
        while self.n_done < self.W or self.assembly:
            msg = comm.Improbe(MPI.ANY_SOURCE, TAG_CTRL, status)
            if msg is not None:
                self._control(msg, status)
                poller = _wait.Poller(self._describe)
                continue
            if snapshots_in:
                msg = comm.Improbe(MPI.ANY_SOURCE, TAG_SNAP, status)
                if msg is not None:
                    self._snapshot_in(msg, status)
                    poller = _wait.Poller(self._describe)
                    continue
            self.versions.reap()
            if poller.waited() > IDLE_WORK_S:
                self.rule.idle()
            poller.idle()
        outstanding = self.versions.all_requests() + [r for r in self.hdr_reqs if r is not None]
        if self.snap_req is not None:
            outstanding.append(self.snap_req)
        _wait.waitall(outstanding, "workers and rank 0 to receive this server's last messages")
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        result = ServerResult(staleness_hist=self.hist.counts,
                              n_pushes=self.n_pushes, n_updates=self.rule.n_updates,
                              n_skipped=self.n_skipped, n_window_pushes=self.n_window_pushes,
                              cpu_s=cpu, wall_s=wall,
                              n_snapshots=self.n_snapshots, buffer_bytes=self._buffer_bytes())
        self._gather_final(result)
        if self.window is not None:
            self.window.free()
        return result

    def _buffer_bytes(self) -> int:
        arrays = self.versions.buffers + self.rule.buffers() + self._state_arrays()
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
        if kind in (PUSH, PUSH_WINDOW):
            self._push(source, w, clock, int(self.ctrl[2]), kind == PUSH_WINDOW)
        elif kind == PULL:
            if int(self.ctrl[3]) != self.shard:
                raise PsgdError(f"pull from rank {source} names shard {int(self.ctrl[3])}, but it "
                                f"reached server rank {self.rank} which holds shard {self.shard}")
            self.pending.append((source, clock, time.perf_counter()))
            self._answer_pulls()
        elif kind == DONE:
            self.done[w] = True
            self.n_done += 1
            self._update_version()
        else:
            raise PsgdError(f"message of unknown kind {kind} from rank {source}")

    def _push(self, source: int, w: int, clock: int, read_version: int, in_window: bool) -> None:
        if in_window:   # lent: read in place, never written (it is the worker's memory)
            buf = self._window_slice(source, clock)
            self.n_window_pushes += 1
        else:
            buf = self.rule.receive_buffer()
            server_push(self.comm, source, self.ctrl, self.shard, self.n, buf)
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
        self.n_pushes += 1
        self.hist.add(staleness)
        if not self.rule.push(buf, clock, staleness, source, borrowed=in_window):
            if not self.config.skip_nonfinite:
                raise NonFinitePush(source, clock)
            self.n_skipped += 1
        self.pushes[w] += 1
        self._update_version()

    def _window_slice(self, source: int, clock: int) -> np.ndarray:
        """This shard's slice of worker ``source``'s gradient in the push window (synced)."""
        check_push_shard(self.comm, source, self.ctrl, self.shard)
        grad = self.segments.get(source)
        if grad is None:
            where = f"push from rank {source} for clock {clock} is in the push window, but"
            if self.window is None:
                raise PsgdError(f"{where} this server has none (PSGD_PS_PUSH_WINDOW must be the "
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
                        self._snapshot_out(c)
        self._answer_pulls()

    def _answer_pulls(self) -> None:
        if not self.pending:
            return
        keep = []
        now = time.perf_counter()
        for dest, clock, since in self.pending:
            if self.version < clock - self.bound:
                keep.append((dest, clock, since))
                continue
            w = dest - self.S
            if self.hdr_reqs[w] is not None:
                _wait.wait(self.hdr_reqs[w], f"rank {dest} to take its previous reply header")
            self.reply_hdr[w] = (REPLY, int((now - since) * 1e6), self.version, self.shard)
            hdr_req, data_req = server_pull(self.comm, dest, self.reply_hdr[w],
                                            self.versions.live)
            self.hdr_reqs[w] = hdr_req
            self.versions.reply_sent(data_req)
        self.pending = keep

    # ------------------------------------------------------------ snapshots and the end

    def _state_arrays(self) -> list:
        state = self.optimizer.state_dict()
        return [np.asarray(state[key], np.float32) for key in self.state_keys]

    def _scalars(self) -> dict:
        return {k: v for k, v in self.optimizer.state_dict().items() if k not in self.state_keys}

    def _entry(self, clock: int) -> Assembly:
        if clock not in self.assembly:
            self.assembly[clock] = Assembly(self.shard_map, self.state_keys)
        return self.assembly[clock]

    def _place_own(self, entry: Assembly) -> None:
        """Rank 0: put its own shard and the optimizer's scalars into ``entry``."""
        entry.scalars = self._scalars()
        entry.place(0, np.stack([self.versions.live] + self._state_arrays()))

    def _snapshot_out(self, clock: int) -> None:
        self.n_snapshots += self.rank != 0
        if self.rank == 0:
            self._place_own(self._entry(clock))
            self._snapshot_done(clock)
            return
        if self.snap_req is not None:
            _wait.wait(self.snap_req, "rank 0 to take the previous snapshot")
        self.snap_buf = pack_shard_state(clock, self.shard, self.versions.live,
                                         self._state_arrays())
        self.snap_req = self.comm.Isend(self.snap_buf, 0, TAG_SNAP)

    def _snapshot_in(self, msg: MPI.Message, status: MPI.Status) -> None:
        source = status.Get_source()
        buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
        _wait.wait(msg.Irecv(buf), f"the snapshot from server rank {source}")
        clock, shard, rows = unpack_shard_state(buf)
        if shard != source:
            raise PsgdError(f"snapshot from rank {source} names shard {shard}")
        self._entry(clock).place(shard, rows)
        self._snapshot_done(clock)

    def _snapshot_done(self, clock: int) -> None:
        if not self.assembly[clock].complete:
            return
        entry = self.assembly.pop(clock)
        self.n_snapshots += 1
        if self.on_snapshot is not None:
            params, opt_state = entry.full_state()
            self.on_snapshot(clock=clock, params=params, opt_state=opt_state)

    def _gather_final(self, result: ServerResult) -> None:
        if self.rank != 0:
            buf = pack_shard_state(self.version, self.shard, self.versions.live,
                                   self._state_arrays())
            _wait.wait(self.comm.Isend(buf, 0, TAG_FINAL), "rank 0 to take the final shard")
            return
        entry = Assembly(self.shard_map, self.state_keys)
        self._place_own(entry)
        status = MPI.Status()
        for s in range(1, self.S):
            msg = _mprobe(self.comm, s, TAG_FINAL, status,
                          f"the final shard of server rank {s}")
            buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            _wait.wait(msg.Irecv(buf), f"the final shard of server rank {s}")
            _, shard, srows = unpack_shard_state(buf)
            entry.place(shard, srows)
        result.params, result.opt_state = entry.full_state()


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
    server = _Server(roles, shard_map, config, init_shard, init_opt_state, on_snapshot,
                     start_clock)
    return server.run()
