"""`--record` and `--replay`: the servers' order of events in one HDF5 file, written and checked.

File layout (``format_version`` 1)::

    /shard_<k>/events   int32 (n_k, 3)   kind (1 push, 2 reply, 3 done), worker, clock
    attrs: format_version, psgd_version, run_id, n_servers, n_workers, start_step,
           end_step, n_events (per shard), settings (JSON of the settings a replay must share)

Rank 0 writes it atomically once every server's events are in, so a file that
exists is whole; one whose arrays were cut short is refused by the counts.
"""
from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
from mpi4py import MPI

import psgd
from psgd.atomic_file import atomic_output
from psgd.errors import UsageError
from psgd.mpi import wait
from psgd.ps.order import DONE, NAMES

FORMAT_VERSION = 1
TAG_RECORD = 31005
# what decides the numbers of a run; the rest (logging, stragglers, stall limits) may differ
SETTINGS = ("data", "model", "protocol", "staleness", "staleness_comp", "comp_lambda",
            "staleness_lr", "overlap", "optimizer", "lr", "lr_schedule", "warmup",
            "lr_step_every", "lr_gamma", "momentum", "weight_decay", "batch_size", "epochs",
            "steps", "seed", "skip_nonfinite", "compress", "compress_bucket", "error_feedback",
            "momentum_correction")


def _shape(settings, n_servers: int, n_workers: int, start_step: int) -> dict:
    flat = settings.as_dict()
    out = {name: flat[name] for name in SETTINGS}
    out.update(servers=n_servers, workers=n_workers, start_step=start_step)
    return out


def save_events(job, events: np.ndarray) -> Path | None:
    """Every server: hand this shard's events to rank 0, which writes ``--record``'s file."""
    roles, comm = job.roles, job.roles.comm
    events = np.ascontiguousarray(events, np.int32)
    if roles.rank != 0:
        wait.wait(comm.Isend(events, dest=0, tag=TAG_RECORD),
                  "rank 0 to take this server's recorded events")
        return None
    shards, status = [events], MPI.Status()
    for rank in range(1, roles.n_servers):
        wait.probe(comm, rank, TAG_RECORD, status, f"server rank {rank} to send its recorded events")
        buf = np.empty(status.Get_count(MPI.BYTE) // 4, np.int32)
        comm.Recv(buf, source=rank, tag=TAG_RECORD)
        shards.append(buf.reshape(-1, 3))
    return write_events(job.settings, shards, roles.n_workers, job.start_step, job.end_step,
                        job.run_id)


def write_events(settings, shards: list, n_workers: int, start_step: int, end_step: int,
                 run_id: str) -> Path:
    """Write ``settings.recording.record``: each shard's int32 (n_k, 3) events, atomically
    (`psgd train --record`, and `psgd simulate`'s schedule)."""
    n_servers = len(shards)
    shape = _shape(settings, n_servers, n_workers, start_step)
    path = Path(settings.recording.record)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp, h5py.File(tmp, "w") as f:
        for k, ev in enumerate(shards):
            f.create_dataset(f"shard_{k}/events", data=np.ascontiguousarray(ev, np.int32))
        f.attrs.update({"format_version": FORMAT_VERSION, "psgd_version": psgd.__version__,
                        "run_id": run_id, "n_servers": n_servers,
                        "n_workers": n_workers, "start_step": start_step,
                        "end_step": end_step, "n_events": [len(ev) for ev in shards],
                        "settings": json.dumps(shape, sort_keys=True)})
    return path


def load_events(path: str, settings, n_servers: int, n_workers: int, start_step: int,
                total_steps: int) -> tuple[np.ndarray, ...]:
    """Each shard's recorded events, once the record is whole and made with this run's settings.

    Raises
    ------
    ValueError
        One line: not a record, a cut-short one, or which settings differ.
    """
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise UsageError(f"--replay {path}: not a readable record ({exc})") from None
    with f:
        attrs = dict(f.attrs)
        if int(attrs.get("format_version", -1)) != FORMAT_VERSION or "settings" not in attrs:
            raise UsageError(f"--replay {path}: not a psgd record (format version "
                             f"{attrs.get('format_version', 'missing')})")
        recorded = json.loads(attrs["settings"])
        this = _shape(settings, n_servers, n_workers, start_step)
        differ = [k for k in this if recorded.get(k) != this[k]]
        if differ:
            raise UsageError(f"--replay {path}: recorded with " + ", ".join(
                f"{k} {recorded.get(k)}" for k in differ) + "; this run has " + ", ".join(
                f"{k} {this[k]}" for k in differ))
        if int(attrs.get("end_step", -1)) != total_steps:
            raise UsageError(f"--replay {path}: the recorded run was stopped at step "
                             f"{attrs.get('end_step')} of {total_steps}; a replay runs to the end, "
                             f"past what was recorded (replay a run that ran to its end)")
        counts = [int(n) for n in attrs.get("n_events", [])]
        if len(counts) != n_servers:
            raise UsageError(f"--replay {path}: holds {len(counts)} shards' events, "
                             f"expected {n_servers}")
        shards = []
        for k, n in enumerate(counts):
            ds = f.get(f"shard_{k}/events")
            if ds is None or ds.shape != (n, 3):
                raise UsageError(f"--replay {path}: shard {k}'s events are cut short or missing "
                                 f"({None if ds is None else ds.shape[0]} of {n})")
            shards.append(_check(path, k, np.asarray(ds[...], np.int32), n_workers))
    return tuple(shards)


def _check(path, shard: int, events: np.ndarray, n_workers: int) -> np.ndarray:
    kinds, workers = events[:, 0], events[:, 1]
    if not np.isin(kinds, list(NAMES)).all() or ((workers < 0) | (workers >= n_workers)).any():
        raise UsageError(f"--replay {path}: shard {shard}'s events hold an unknown kind or worker")
    if np.count_nonzero(kinds == DONE) != n_workers:
        raise UsageError(f"--replay {path}: shard {shard}'s events end before every worker "
                         f"was done (a cut-short record)")
    return events
