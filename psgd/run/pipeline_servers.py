"""Checkpoints of a pipeline whose stage replicas push to parameter servers.

The servers hold each stage's parameters and optimizer state.  At every --checkpoint-every
step (and at the end) the first server of each stage sends its stage's assembled slice to
the grid's rank 0, which joins the K slices in stage order and writes one checkpoint; a
resumed run's servers start from their shard of it at its step.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.mpi import wait
from psgd.ps.messages import _mprobe

TAG_STATE = 4905


def pack(clock: int, params: np.ndarray, opt_state: dict, keys: tuple) -> np.ndarray:
    """``[clock, steps, params, opt_state[key] for key in keys]`` as one float64 buffer
    (float32 values are exact in it)."""
    head = [float(clock), float(opt_state.get("steps", 0))]
    return np.concatenate([head, params, *(np.asarray(opt_state[k]) for k in keys)]).astype(np.float64)


def unpack(buf: np.ndarray, keys: tuple) -> tuple[int, np.ndarray, dict]:
    """Inverse of :func:`pack`: ``(clock, params float32, opt_state)``."""
    clock, steps = int(buf[0]), int(buf[1])
    rows = buf[2:].reshape(1 + len(keys), -1).astype(np.float32)
    return clock, rows[0], {"steps": steps, **{k: rows[1 + i] for i, k in enumerate(keys)}}


class StateSender:
    """A stage's first server: sends its stage's state for a clock to the grid's rank 0."""

    def __init__(self, comm: MPI.Comm, dest: int, keys: tuple, total: int) -> None:
        self.comm, self.dest, self.keys, self.total = comm, dest, keys, total
        self.pending: list = []

    def snapshot(self, clock: int, params: np.ndarray, opt_state: dict) -> None:
        """The state after step ``clock + 1`` (the end's is sent by :meth:`final`)."""
        if clock + 1 < self.total:
            self._send(clock, params, opt_state)

    def final(self, params: np.ndarray, opt_state: dict) -> None:
        self._send(self.total - 1, params, opt_state)
        wait.waitall([req for req, _ in self.pending], "the grid's rank 0 to take the stage state")

    def _send(self, clock, params, opt_state) -> None:
        buf = pack(clock, params, opt_state, self.keys)
        self.pending.append((self.comm.Isend(buf, self.dest, TAG_STATE), buf))


def receive_states(comm: MPI.Comm, sources: list[int], keys: tuple, step: int) -> tuple:
    """The grid's rank 0: every stage's state after ``step``, joined in stage order into the
    whole ``(params, opt_state)``."""
    parts, status = [], MPI.Status()
    for stage, source in enumerate(sources):
        msg = _mprobe(comm, source, TAG_STATE, status, f"stage {stage}'s server to send its state")
        buf = np.empty(status.Get_count(MPI.DOUBLE), np.float64)
        wait.wait(msg.Irecv(buf), f"stage {stage}'s state")
        clock, params, state = unpack(buf, keys)
        if clock + 1 != step:
            raise RuntimeError(f"stage {stage}'s servers sent the state after step {clock + 1}, "
                               f"not {step}")
        parts.append((params, state))
    params = np.concatenate([p for p, _ in parts])
    state = {"steps": parts[0][1]["steps"],
             **{k: np.concatenate([s[k] for _, s in parts]) for k in keys}}
    return params, state
