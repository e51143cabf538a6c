"""The shapes a protocol's parts must have, as ``typing.Protocol``s the tests check.

A registry entry (:class:`psgd.protocols.Protocol`) names a worker half, and for a
parameter-server protocol a server half and an update rule.  The optional parts of a
worker half have their defaults in :class:`psgd.halves.WorkerHalf`; the optional parts
of an update rule in :class:`psgd.ps.update.UpdateRuleBase`.
"""
from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

import numpy as np

from psgd.config import ProtocolConfig


@runtime_checkable
class WorkerHalf(Protocol):
    """A worker rank's part: ``Class(roles, shard_map, config)``."""

    stats: dict
    optimizer: object             # None when the servers own it
    grad_buffer: np.ndarray | None
    momentum: object              # WorkerMomentum under --momentum-correction, else None
    serve: Callable | None
    compensation: dict | None

    def start(self, params: np.ndarray, clock: int = 0) -> None: ...
    def step(self, params: np.ndarray, grad: np.ndarray, clock: int, lr: float) -> None: ...
    def finish(self): ...
    def use_model(self, model) -> None: ...
    def before_batch(self, params: np.ndarray, x) -> None: ...
    def runs_steps(self) -> bool: ...
    def read_all(self, params: np.ndarray) -> None: ...


@runtime_checkable
class StepRunner(WorkerHalf, Protocol):
    """A worker half whose :meth:`runs_steps` may be True (hogwild's fused steps)."""

    def run_steps(self, params: np.ndarray, x, y: np.ndarray, rows: np.ndarray, clock: int,
                  lrs: np.ndarray) -> tuple: ...


@runtime_checkable
class DecentralizedWorker(WorkerHalf, Protocol):
    """The worker half of a protocol with a graph (its models differ per worker)."""

    def average(self, params: np.ndarray, out: np.ndarray) -> float: ...


class ServerHalf(Protocol):
    """A parameter server rank's part (a function), returning a ``psgd.mpi.report.ServerResult``."""

    def __call__(self, roles, shard_map, config: ProtocolConfig, *, init_shard, init_opt_state,
                 on_snapshot, start_clock): ...


@runtime_checkable
class UpdateRule(Protocol):
    """How a parameter server applies pushes: ``Class(config, optimizer, versions, n_workers)``."""

    n_updates: int

    def buffers(self) -> list: ...
    def receive_buffer(self) -> np.ndarray: ...
    def push(self, grad: np.ndarray, clock: int, staleness: int, source: int,
             borrowed: bool = False, worker: int = 0) -> bool: ...
    def advance(self, old_version: int, new_version: int) -> bool: ...
    def idle(self) -> None: ...
    def replied(self, worker: int, clock: int, live: np.ndarray) -> np.ndarray: ...
    def reply_sent(self, worker: int, clock: int, request) -> None: ...
    def requests(self) -> list: ...
    def worker_done(self, worker: int) -> None: ...
    def state(self) -> dict: ...
    def load_state(self, state: dict) -> None: ...
    def compensation(self) -> dict | None: ...
    def worker_momentum(self) -> float: ...
