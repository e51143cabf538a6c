"""Synchronous gossip (D-PSGD) simulated: each worker's step ends on the graph; training each model.

Within a node MPI moves a model only while both ends poll (no asynchronous
progress), so a worker's step t ends an exchange and a mixing after the last of
its neighbourhood has computed step t. Between nodes MPICH's TCP path moves the
share of it the kernel's socket buffers took when it was posted while the ranks
compute (``HIDDEN_EXCHANGE`` of the exchange), the rest once both ends poll. The costs
are `psgd plan`'s gossip row's, or the exchange is a real run's mean step span
(:func:`measured_exchange`).
Training mixes the models with the mixing matrix and steps each worker's own
optimizer, as :class:`psgd.gossip.dpsgd.GossipWorker` does.
"""
from __future__ import annotations

import importlib
import time

import numpy as np

from psgd.errors import PsgdError
from psgd.nn.optim import make_optimizer
from psgd.plan.cost import HIDDEN_EXCHANGE, STEP_PASSES, Traffic


def graph(protocol, topology: str, workers: int):
    """``protocol``'s registry graph on ``topology``: a mixing matrix (float64 (W, W):
    synchronous gossip) or each worker's partners (a list of lists: AD-PSGD's pairs).

    Raises
    ------
    ValueError
        One line: a topology or W the protocol cannot run (adpsgd: W < 2).
    """
    module, name = protocol.graph.split(":")
    return getattr(importlib.import_module(module), name)(topology, workers)


def costs(matrix: np.ndarray, job, net) -> tuple[float, float]:
    """Seconds of one step's exchange (every worker's model to each neighbour, on plan's links)
    and of the mixing and step (d + 1 models and the optimizer's passes)."""
    t = Traffic(job)
    degree = 0
    for i in range(matrix.shape[0]):
        near = [j for j in np.flatnonzero(matrix[i]) if j != i]
        degree = max(degree, len(near))
        for j in near:
            t.carry(i, int(j), job.nbytes)
    exchange = t.seconds(net, degree) if degree else 0.0
    return exchange, (degree + 1 + STEP_PASSES) * job.nbytes / net.shm_bandwidth


def measured_exchange(steps_s, mix_s: float) -> float:
    """Seconds of one exchange from a real run's step spans ``steps_s`` (seconds): their mean,
    less the mixing and step the simulation charges (at least 0). The mean, not a draw per
    step: a span also holds the wait for a neighbour that was descheduled, and independent
    draws would count such a wait again in each neighbour's maximum."""
    return max(float(np.mean(steps_s)) - mix_s, 0.0)


def step_ends(times: np.ndarray, matrix: np.ndarray, exchange_s: float,
              mix_s: float, nodes=None) -> np.ndarray:
    """When each worker's step ends (float64 (W, T)), ``times`` its compute (W, T) seconds.

    A neighbour on the worker's node: its model lands an exchange after the later of the two
    computed (both must poll). A neighbour on another node (``nodes``: each worker's node, int
    (W,); None: all on one): its model, posted when its previous step ended, lands an exchange
    after that at the earliest, and the share :data:`HIDDEN_EXCHANGE` did not move under the
    compute after the later of the two computed. The step ends a mixing after the worker
    computed and the last of its neighbours' models landed.
    """
    W, T = times.shape
    off = (matrix > 0) & ~np.eye(W, dtype=bool)
    nodes = np.zeros(W, int) if nodes is None else np.asarray(nodes)
    remote = off & (nodes[:, None] != nodes[None, :])
    local = off & ~remote
    near = local.any(axis=1)   # a worker that must poll for some model: itself after computing
    ends, prev = np.empty((W, T)), np.zeros(W)
    for t in range(T):
        ready = prev + times[:, t]
        landed = np.maximum(np.where(local, ready[None, :], -np.inf).max(axis=1),
                            np.where(near, ready, -np.inf)) + exchange_s
        both = np.maximum(ready[:, None], ready[None, :]) + (1 - HIDDEN_EXCHANGE) * exchange_s
        landed = np.maximum(landed, np.where(remote, np.maximum(prev[None, :] + exchange_s, both),
                                             -np.inf).max(axis=1))
        prev = np.maximum(ready, landed) + mix_s
        ends[:, t] = prev
    return ends


def summary(ends: np.ndarray, times: np.ndarray, exchange_s: float) -> dict:
    """The JSON-ready summary, in the parameter servers' keys (staleness 0: every step mixes
    the neighbours' models of the same step); the steady rate from the earliest end of a
    first step, as a real run's timeline is read (bench_simulate.real_rate)."""
    W, T = ends.shape
    sec = float(ends.max())
    busy = times.sum(axis=1) / sec
    first = ends[:, 0].min()
    steady = W * (T - 1) / (sec - first) if T > 1 and sec > first else float("inf")
    return {"simulated_s": sec, "updates": W * T, "updates_per_s": W * T / sec,
            "steady_updates_per_s": steady,
            "staleness": {"mean": 0.0, "p50": 0, "p99": 0, "max": 0, "histogram": [W * T]},
            "delay": {"mean": 0.0, "p50": 0, "p99": 0, "max": 0, "histogram": [W * T]},
            "worker_utilisation": {"mean": float(busy.mean()), "min": float(busy.min()),
                                   "max": float(busy.max())},
            "server_utilisation": [], "link_utilisation": min(1.0, exchange_s * T / sec)}


class Clocks:
    """What :func:`psgd.simulate.report.train_and_log` reads of a schedule: the simulated time
    at each evaluation's index (here a clock: the last worker's end of it) and in all."""

    def __init__(self, ends: np.ndarray) -> None:
        self.times = ends.max(axis=0)
        self.seconds = float(self.times[-1])


def train_mixing(job, matrix: np.ndarray, workers: int, on_eval=None,
                 eval_every: int = 0) -> dict:
    """Train W models: every clock, each worker's gradient at its model, then its model mixed
    with its neighbours' (``matrix``) and stepped by its own optimizer. Returns the mean model
    (float32 (n,)) as ``params``, the samples, the seconds and the bytes of the W models.
    ``on_eval(clock, updates, mean model, samples)`` every ``eval_every`` updates."""
    from psgd.gossip.dpsgd import mix
    from psgd.simulate.train import VirtualWorkers
    config, model = job.config, job.model
    vw = VirtualWorkers(job, workers)
    models, new = vw.params, np.empty_like(vw.params)
    optimizers = [make_optimizer(config.optimizer, model.n_params, **config.opt_hparams)
                  for _ in range(workers)]
    near = [np.array([j for j in np.flatnonzero(matrix[i]) if j != i], int) for i in range(workers)]
    t0 = time.perf_counter()
    for clock in range(job.total_steps):
        for i in range(workers):
            grad = vw.gradient(i, clock)
            mix(models[i], np.float32(matrix[i, i]), models[near[i]],
                matrix[i, near[i]].astype(np.float32), out=new[i])
            if np.isfinite(grad).all():
                optimizers[i].step(new[i], grad, config.lr_schedule(clock))
            elif not config.skip_nonfinite:
                raise PsgdError(f"the gradient of clock {clock} on worker {i} holds NaN or Inf; "
                                f"lower the learning rate, or pass --skip-nonfinite")
        models[:] = new
        if on_eval is not None and eval_every and (clock + 1) * workers % eval_every == 0:
            on_eval(clock, (clock + 1) * workers, models.mean(axis=0, dtype=np.float32),
                    vw.samples)
    return {"params": models.mean(axis=0, dtype=np.float32), "samples": vw.samples,
            "seconds": time.perf_counter() - t0,
            "worker_copies_bytes": int(vw.nbytes + new.nbytes)}
