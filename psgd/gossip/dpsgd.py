"""Synchronous gossip (D-PSGD, Lian et al. 2017): x_i <- sum_j W_ij x_j - lr * g_i(x_i) on a fixed graph."""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from psgd.config import ProtocolConfig
from psgd.gossip import averaging, topology
from psgd.halves import WorkerHalf
from psgd.mpi import wait
from psgd.mpi.roles import Roles
from psgd.nn.optim import make_optimizer
from psgd.nn.vectors import check_flat


class GossipWorker(WorkerHalf):
    """One worker of D-PSGD: its own model and optimizer, mixed with its neighbours' every step.

    The exchange of a step's models (``Ineighbor_allgather`` on a distributed
    graph communicator of the topology) is posted as soon as the step's model
    is known, so it travels while the next gradient is computed at that same
    model, as D-PSGD's update allows; :meth:`step` waits for it, mixes, and
    applies the optimizer (local state: sgd, momentum, nesterov, adam) with
    the gradient.

    Parameters
    ----------
    roles : Roles
        This rank's roles (a worker; no servers).
    shard_map : None
        Unused: there are no shards.
    config : ProtocolConfig
        ``topology``, ``n_params``, the optimizer and its hyper-parameters.

    Attributes
    ----------
    stats : dict
        Cumulative ``wait_s`` (waiting for the neighbours' models), ``mix_s``,
        ``optimizer_s``, ``step_s``; ``steps``, ``skipped`` (non-finite gradients
        skipped), ``bytes_sent`` (model bytes this worker sent) and ``degree``.
    """

    def __init__(self, roles: Roles, shard_map, config: ProtocolConfig) -> None:
        self.comm = roles.worker_comm
        self.rank, size = self.comm.Get_rank(), self.comm.Get_size()
        self.n_params = int(config.n_params)
        matrix = topology.mixing_matrix(config.topology or topology.DEFAULT, size)
        self.near = topology.neighbours(config.topology or topology.DEFAULT, size)[self.rank]
        self.self_weight = np.float32(matrix[self.rank, self.rank])
        self.weights = matrix[self.rank, self.near].astype(np.float32)
        self.graph = self.comm.Create_dist_graph_adjacent(self.near, self.near, reorder=False)
        self.optimizer = make_optimizer(config.optimizer, self.n_params, **config.opt_hparams)
        self.skip_nonfinite = bool(config.skip_nonfinite)
        self.sent = np.zeros(self.n_params, np.float32)           # x_i of the exchange in flight
        self.received = np.zeros((len(self.near), self.n_params), np.float32)
        self.request: MPI.Request | None = None
        self.stats = {"wait_s": 0.0, "mix_s": 0.0, "optimizer_s": 0.0, "step_s": 0.0,
                      "steps": 0, "skipped": 0, "bytes_sent": 0, "degree": len(self.near)}

    def start(self, params: np.ndarray, clock: int = 0, same: bool = True) -> None:
        """Start every worker from worker 0's ``params`` (collective; ``same=False``: each from
        its own, for tests) and post the first exchange."""
        check_flat(params, self.n_params, "gossip params")
        if same:
            wait.wait(self.comm.Ibcast(params, root=0), "worker 0 (broadcast of initial parameters)")
        self._post(params)

    def _post(self, params: np.ndarray) -> None:
        self.sent[:] = params
        if self.near:
            self.request = self.graph.Ineighbor_allgather(self.sent, self.received)

    def _wait(self, what: str) -> None:
        if self.request is not None:
            wait.wait(self.request, what)
            self.request = None

    def step(self, params: np.ndarray, grad: np.ndarray, clock: int, lr: float) -> None:
        """Mix ``params`` with the neighbours' models, then step with ``grad`` (computed at ``params``)."""
        t0 = time.perf_counter()
        check_flat(params, self.n_params, "gossip params")
        check_flat(grad, self.n_params, "gossip grad")
        self._wait(f"neighbour workers {self.near} (gossip exchange of clock {clock})")
        t1 = time.perf_counter()
        mix(self.sent, self.self_weight, self.received, self.weights, out=params)
        t2 = time.perf_counter()
        averaging.local_step(self, params, grad, lr, clock)
        t3 = time.perf_counter()
        self.stats["bytes_sent"] += len(self.near) * self.sent.nbytes
        self._post(params)
        self.stats["steps"] += 1
        self.stats["wait_s"] += t1 - t0
        self.stats["mix_s"] += t2 - t1
        self.stats["optimizer_s"] += t3 - t2
        self.stats["step_s"] += time.perf_counter() - t0

    def average(self, params: np.ndarray, out: np.ndarray) -> float:
        """The workers' mean model into ``out``; returns the consensus distance (collective)."""
        return averaging.average(self.comm, params, out)

    def finish(self) -> dict:
        """Complete the exchange still in flight (collective); returns :attr:`stats`."""
        self._wait("neighbour workers (the last gossip exchange)")
        self.graph.Free()
        return self.stats


def mix(own: np.ndarray, self_weight: float, received: np.ndarray, weights: np.ndarray,
        out: np.ndarray) -> np.ndarray:
    """``out = self_weight * own + sum_k weights[k] * received[k]`` (float32, shapes (n,), (d, n), (d,))."""
    np.multiply(own, self_weight, out=out)
    for k in range(len(weights)):
        out += weights[k] * received[k]
    return out
