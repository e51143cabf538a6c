"""`--record`/`--replay` of a pipeline over servers: every stage group's servers in one record.

Shard k of the record is server rank k (stage group k // (S / K)); its workers are the
group's D replicas.  A resumed run replays from its step: the stage servers hold each
checkpoint's next clock until the checkpoint is taken (``hold_at_snapshots``), so a record
cuts there, after the last push of the clock before, and the events before it give the
delays the compensation's running means had counted (``replayed_before``).
"""
from __future__ import annotations

from dataclasses import replace

import h5py
import numpy as np
from mpi4py import MPI

from psgd.errors import UsageError
from psgd.mpi import wait
from psgd.ps.order import PUSHED
from psgd.run.job import agree
from psgd.run.record import TAG_RECORD, load_events, write_events
from psgd.run.tensor_servers import servers_of


def save(comm: MPI.Comm, settings, n_servers: int, replicas: int, events, start: int,
         total: int, run_id: str) -> None:
    """Every server: its events to rank 0, which writes ``--record``'s file."""
    events = np.ascontiguousarray(events, np.int32)
    if comm.Get_rank() != 0:
        wait.wait(comm.Isend(events, dest=0, tag=TAG_RECORD),
                  "rank 0 to take this server's recorded events")
        return
    shards, status = [events], MPI.Status()
    for rank in range(1, n_servers):
        wait.probe(comm, rank, TAG_RECORD, status, f"server rank {rank} to send its recorded events")
        buf = np.empty(status.Get_count(MPI.BYTE) // 4, np.int32)
        comm.Recv(buf, source=rank, tag=TAG_RECORD)
        shards.append(buf.reshape(-1, 3))
    write_events(settings, shards, replicas, start, total, run_id)


def load(settings, n_servers: int, replicas: int, start: int, total: int) -> tuple[tuple, tuple]:
    """--replay's events per server from ``start`` on, and those before it (a resumed run's)."""
    path = settings.recording.replay
    try:
        with h5py.File(path, "r") as f:
            recorded = int(f.attrs.get("start_step", 0))
    except OSError as exc:
        raise UsageError(f"--replay {path}: not a readable record ({exc})") from None
    if recorded > start:
        raise UsageError(f"--replay {path}: the record starts at step {recorded}, after this "
                         f"run's step {start}")
    events = load_events(path, settings, n_servers, replicas, recorded, total)
    tails, heads = [], []
    for shard, ev in enumerate(events):
        pushed = np.flatnonzero((ev[:, 0] == PUSHED) & (ev[:, 2] == start - 1))
        cut = int(pushed[-1]) + 1 if start > recorded else 0
        if start > recorded and (pushed.size != replicas or (ev[:cut, 2] >= start).any()):
            raise UsageError(f"--replay {path}: shard {shard}'s record does not cut at step "
                             f"{start} (record with --checkpoint-every a divisor of {start})")
        tails.append(ev[cut:])
        heads.append(ev[:cut])
    return tuple(tails), tuple(heads)


def replay_into(comm: MPI.Comm, settings, groups, start: int, total: int, debug: bool) -> None:
    """--replay over the stage servers (every rank, for one error line): each server takes
    its group's recorded events from ``start`` on, and those before it."""
    if not settings.recording.replay:
        return
    tails, heads = agree(comm, lambda: load(settings, servers_of(settings), groups.roles.n_workers,
                                            start, total), debug, "read the --replay record",
                         "agreeing on the --replay record")
    if groups.roles.is_server:
        per = groups.roles.n_servers   # the group's servers: ranks part * per ..
        mine = slice(groups.part * per, (groups.part + 1) * per)
        groups.config = replace(groups.config, replay_events=tails[mine],
                                replayed_before=heads[mine])
