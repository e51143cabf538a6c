"""Parameter servers across the D replicas of a grid's model parts (bsp, ssp, asp).

The parts are a --tensor/--spatial grid's slices or a --pipeline's stages.  With S servers and T model parts, part t's D replicas and S/T servers form one
parameter-server group of their own: its flat vector is part t's local vector, so each
tensor slice is its own part of the servers' state.  Ranks 0..S-1 are the servers (server
s serves part s // (S/T)), ranks S.. the D x T grid.  The halves are the protocol's own.
A part's state (its local vector, optimizer state, clock) travels packed in one byte buffer
(:func:`pack_state`): from the first replica to the servers on set-up (a resumed run's),
and from the part's lead server to the first replica for each checkpoint.
"""
from __future__ import annotations

import json

import numpy as np
from mpi4py import MPI

from psgd.mpi import wait
from psgd.mpi.phase import phase
from psgd.mpi.roles import assign_roles
from psgd.mpi.shardmap import ShardMap
from psgd.nn.optim import make_schedule
from psgd.protocols import get
from psgd.ps.messages import _mprobe

TAG_STATE = 31007    # a part's state, from its lead server to its first replica


def pack_state(step: int, final: bool, params: np.ndarray, opt_state: dict | None) -> np.ndarray:
    """One uint8 buffer: (step, final, names' length, n, k), the JSON of the optimizer state's
    array names and scalars (padded to 8 bytes), then params and the k arrays as float32."""
    opt_state = opt_state or {}
    arrays = {k: v for k, v in opt_state.items() if np.ndim(v)}
    scalars = {k: getattr(v, "item", lambda v=v: v)() for k, v in opt_state.items() if not np.ndim(v)}
    names = json.dumps([list(arrays), scalars]).encode()
    names += b" " * (-len(names) % 8)
    head = np.array([step, final, len(names), params.size, len(arrays)], np.int64)
    rows = np.stack([params, *arrays.values()]).astype(np.float32)
    return np.concatenate([head.view(np.uint8), np.frombuffer(names, np.uint8), rows.view(np.uint8).reshape(-1)])


def unpack_state(buf: np.ndarray) -> tuple[int, bool, np.ndarray, dict]:
    """(step, final, params, optimizer state) of a :func:`pack_state` buffer."""
    step, final, size, n, k = (int(v) for v in buf[:40].view(np.int64))
    arrays, scalars = json.loads(bytes(buf[40:40 + size]))
    rows = buf[40 + size:].view(np.float32).reshape(1 + k, n)
    return step, bool(final), rows[0].copy(), {**dict(zip(arrays, rows[1:].copy())), **scalars}


def servers_of(s) -> int:
    """S: the job's server ranks (0 under a protocol without servers)."""
    return s.servers if get(s.protocol).servers else 0


def check(s, parts: int, axis: str) -> None:
    """Refuse a server protocol the grid does not run, or servers the parts cannot share."""
    protocol = get(s.protocol)
    if protocol.decentralized or (protocol.servers and protocol.update_rule is None):
        raise ValueError(f"--{axis} runs --protocol allreduce or a parameter server with an "
                         f"update rule across its replicas, not {s.protocol}")
    if not protocol.servers:
        return
    if s.servers < parts or s.servers % parts:
        raise ValueError(f"--servers {s.servers}: each of the {parts} model parts has servers of its "
                         f"own, give a multiple of {parts}")
    if s.split.dtype != "float32":
        raise ValueError(f"--dtype {s.split.dtype}: the parameter servers hold float32; use --protocol "
                         f"allreduce with --{axis}")
    if (s.checkpoint_dir or s.resume) and not protocol.can("server-snapshots"):
        raise ValueError(f"--checkpoint-dir/--resume with --{axis} run under --protocol allreduce "
                         f"only (the servers of {s.protocol} keep no checkpoint yet)")


class ServerGroups:
    """This rank's parameter-server group: part t's S/T servers and its D replicas."""

    def __init__(self, comm, s, parts: int) -> None:
        n_servers, rank = servers_of(s), comm.Get_rank()
        per = n_servers // parts
        self.part = rank // per if rank < n_servers else (rank - n_servers) % parts
        with phase("splitting the grid's server groups"):
            self.comm = comm.Split(self.part, rank)   # its servers first, then its replicas
            self.roles = assign_roles(self.comm, per)
        self.settings, self.protocol = s, get(s.protocol)
        self.config = self.shard_map = None

    def share(self, params: np.ndarray | None, total: int, start: int = 0,
              opt_state: dict | None = None, **config) -> tuple:
        """The part's initial state (local vector, step, optimizer state: a resumed run's), from
        its first replica to its servers (collective); ``total``, the run's steps (its
        learning-rate schedule's), is the first replica's; ``config``, more fields of the
        protocol's config (a pipeline's). Returns (params, start, opt_state)."""
        root = self.roles.n_servers
        buf = pack_state(start, False, params, opt_state) if params is not None else None
        n = np.array([buf.size if buf is not None else 0, total], np.int64)
        wait.wait(self.comm.Ibcast(n, root=root), "the first replica to send the part's size")
        buf = buf if buf is not None else np.empty(int(n[0]), np.uint8)
        wait.wait(self.comm.Ibcast(buf, root=root), "the first replica to send the part's parameters")
        start, _, params, opt_state = unpack_state(buf)
        s = self.settings
        lr = make_schedule(s.lr_schedule, s.lr, int(n[1]), warmup=s.warmup,
                           step_every=s.lr_step_every, gamma=s.lr_gamma)
        self.config = self.protocol.config(
            params.size, staleness=s.staleness, staleness_max=s.staleness_max, optimizer=s.optimizer,
            opt_hparams={"momentum": s.momentum, "weight_decay": s.weight_decay}, lr_schedule=lr,
            seed=s.seed, **s.for_halves(),
            n_workers=self.roles.n_workers, snapshot_every=s.checkpoint_every if s.checkpoint_dir else 0,
            **config)
        self.total = int(n[1])
        self.shard_map = ShardMap(params.size, self.roles.n_servers)
        return params, start, opt_state

    def serve(self, state: tuple):
        """A server's run: its shard of the part's vector until every replica is done; with
        --checkpoint-dir the lead server hands each snapshot and the final state to the part's
        first replica.  Returns the protocol's ServerResult."""
        params, start, opt_state = state
        shard, sends = self.roles.server_index, []
        lo, hi = self.shard_map.range(shard)
        cut = {k: v[lo:hi].copy() if np.ndim(v) else v for k, v in opt_state.items()} or None
        lead = self.settings.checkpoint_dir and shard == 0

        def hand(step, final, params, opt_state):
            sends.append(pack_state(step, final, params, opt_state))
            sends.append(self.comm.Isend(sends[-1], self.roles.n_servers, TAG_STATE))

        with phase("serving the grid's part", watch=False):
            result = self.protocol.serve(
                self.roles, self.shard_map, self.config, init_shard=self.shard_map.view(params, shard).copy(),
                init_opt_state=cut, start_clock=start,
                on_snapshot=(lambda clock, params, opt_state: hand(clock + 1, False, params, opt_state))
                if lead else None)
        if lead:
            hand(-1, True, result.params, result.opt_state)   # the replicas know where they stopped
            for request in sends[1::2]:
                wait.wait(request, "the part's first replica to take its state")
        return result

    def receive_state(self, final: bool) -> tuple[int, np.ndarray, dict]:
        """The first replica: (step, params, optimizer state) of the part's next snapshot, or
        (``final``) of the state its servers ended with, from the lead server."""
        status = MPI.Status()
        while True:
            msg = _mprobe(self.comm, 0, TAG_STATE, status, "the part's lead server to send its state")
            buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            wait.wait(msg.Irecv(buf), "the part's state from its lead server")
            step, last, params, opt_state = unpack_state(buf)
            if last or not final:
                return step, params, opt_state

    def worker(self):
        """This replica's worker half (it pushes the part's gradient, pulls its parameters)."""
        return self.protocol.make_worker(self.roles, self.shard_map, self.config)


def workers_comm(comm, n_servers: int):
    """The grid's ranks (all but the servers); None on a server."""
    out = comm.Split(1 if comm.Get_rank() >= n_servers else MPI.UNDEFINED, comm.Get_rank())
    return None if out == MPI.COMM_NULL else out
