"""Parameter servers across the D replicas of a grid's model parts (bsp, ssp, asp).

The parts are a --tensor/--spatial grid's slices or a --pipeline's stages.  With S servers and T model parts, part t's D replicas and S/T servers form one
parameter-server group of their own: its flat vector is part t's local vector, so each
tensor slice is its own part of the servers' state.  Ranks 0..S-1 are the servers (server
s serves part s // (S/T)), ranks S.. the D x T grid.  The halves are the protocol's own.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.mpi import wait
from psgd.mpi.phase import phase
from psgd.mpi.roles import assign_roles
from psgd.mpi.shardmap import ShardMap
from psgd.nn.optim import make_schedule
from psgd.protocols import get


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
    if (s.checkpoint_dir or s.resume) and axis != "pipeline":
        raise ValueError(f"--checkpoint-dir/--resume with --{axis} run under --protocol allreduce "
                         f"only (the servers of a grid keep no checkpoint yet)")
    if (s.checkpoint_dir or s.resume) and protocol.bound != 0.0:
        raise ValueError(f"--checkpoint-dir/--resume of a pipeline over servers run under "
                         f"--protocol bsp or allreduce, not {s.protocol} (a resumed run is "
                         f"exact where the servers apply every replica's step together)")


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
        self.world, self.n_servers, self.parts = comm, n_servers, parts
        self.total = self.offset = self.start = 0
        self.resume_path = None   # a resumed pipeline's checkpoint file

    def share(self, params: np.ndarray | None, total: int, offset: int = 0,
              start: int = 0) -> np.ndarray:
        """The part's initial local vector, from its first replica to its servers (collective);
        ``total``, the run's steps (its learning-rate schedule's), ``offset``, the part's first
        element in the whole vector, and ``start``, a resumed run's step, are the first
        replica's."""
        root = self.roles.n_servers
        n = np.array([params.size if params is not None else 0, total, offset, start], np.int64)
        wait.wait(self.comm.Ibcast(n, root=root), "the first replica to send the part's size")
        self.total, self.offset, self.start = (int(v) for v in n[1:])
        buf = params if params is not None else np.empty(int(n[0]), np.float32)
        wait.wait(self.comm.Ibcast(buf, root=root), "the first replica to send the part's parameters")
        s = self.settings
        lr = make_schedule(s.lr_schedule, s.lr, int(n[1]), warmup=s.warmup,
                           step_every=s.lr_step_every, gamma=s.lr_gamma)
        self.config = self.protocol.config(
            int(n[0]), staleness=s.staleness, staleness_max=s.staleness_max, optimizer=s.optimizer,
            opt_hparams={"momentum": s.momentum, "weight_decay": s.weight_decay}, lr_schedule=lr,
            compensation=s.compensation, seed=s.seed,
            n_workers=self.roles.n_workers,
            snapshot_every=s.checkpoint_every if s.checkpoint_dir else 0)
        self.shard_map = ShardMap(int(n[0]), self.roles.n_servers)
        return buf

    def serve(self, params: np.ndarray) -> None:
        """A server's run: its shard of the part's vector until every replica is done; with
        --checkpoint-dir the part's first server sends the part's state to the grid's rank 0
        at each checkpoint (:mod:`psgd.run.pipeline_servers`)."""
        from psgd.run.pipeline_servers import StateSender
        shard, s = self.roles.server_index, self.settings
        sender = None
        if s.checkpoint_dir and self.roles.rank == 0:
            sender = StateSender(self.world, self.n_servers, state_keys(s), self.total)
        with phase("serving the grid's part", watch=False):
            result = self.protocol.serve(
                self.roles, self.shard_map, self.config,
                init_shard=self.shard_map.view(params, shard).copy(),
                init_opt_state=self._resumed_state(shard), start_clock=self.start,
                on_snapshot=sender.snapshot if sender is not None else None)
        if sender is not None:
            sender.final(result.params, result.opt_state or {})

    def _resumed_state(self, shard: int) -> dict | None:
        """A resumed run's optimizer state for this server's shard of the part."""
        if not self.start:
            return None
        from psgd.run.checkpoint import load_checkpoint
        lo, hi = self.shard_map.range(shard)
        return load_checkpoint(self.resume_path, (self.offset + lo, self.offset + hi)).opt_state

    def state_sources(self) -> list[int]:
        """The world rank of each part's first server."""
        per = self.n_servers // self.parts
        return [p * per for p in range(self.parts)]

    def worker(self):
        """This replica's worker half (it pushes the part's gradient, pulls its parameters)."""
        return self.protocol.make_worker(self.roles, self.shard_map, self.config)


def state_keys(s) -> tuple:
    """The optimizer's per-element state keys (``--optimizer``'s) a checkpoint carries."""
    from psgd.nn.optim import make_optimizer
    return tuple(make_optimizer(s.optimizer, 1).state_keys)


def workers_comm(comm, n_servers: int):
    """The grid's ranks (all but the servers); None on a server."""
    out = comm.Split(1 if comm.Get_rank() >= n_servers else MPI.UNDEFINED, comm.Get_rank())
    return None if out == MPI.COMM_NULL else out
