"""The network of a simulated job: each transfer queues for the links of :mod:`psgd.plan.cost`.

Ranks sit on nodes as :class:`psgd.plan.cost.Job` places them (servers 0..S-1,
then the workers). A transfer between nodes holds the sender's outgoing and
the receiver's incoming link (switched), or the one link every node shares,
for its bytes over the bandwidth, then lands a latency later; within a node it
is one copy at the shared-memory bandwidth. One transfer's time alone is
:meth:`psgd.plan.cost.Traffic.seconds` of it. Each message's latency is the
network's, or drawn (seeded) from measured ones.
"""
from __future__ import annotations

import time

import numpy as np

from psgd.plan.cost import STEP_PASSES, Job, Network, Traffic


def measure_shm_bandwidth(n_params: int, optimizer: str = "sgd", seconds: float = 0.1) -> float:
    """Bytes/s of one of the cost model's passes over a float32 vector of ``n_params`` on this
    machine: ``optimizer``'s step on it, timed, is STEP_PASSES of them (what the model charges
    a step, a push's apply and a mixing are counted in)."""
    from psgd.nn.optim import make_optimizer
    opt = make_optimizer(optimizer, n_params)
    params, grad = np.zeros(n_params, np.float32), np.full(n_params, 1e-3, np.float32)
    opt.step(params, grad, 1e-3)   # compile
    steps, start = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - start < seconds:
        opt.step(params, grad, 1e-3)
        steps += 1
    return STEP_PASSES * 4.0 * n_params * steps / (time.perf_counter() - start)


def transfer_s(job: Job, net: Network, a: int, b: int, nbytes: float) -> float:
    """Seconds one transfer of ``nbytes`` from rank ``a`` to rank ``b`` takes on idle links."""
    t = Traffic(job)
    t.carry(a, b, nbytes)
    return t.seconds(net, 1)


class Links:
    """When each link is next free; :meth:`send` queues a transfer and says when it lands."""

    def __init__(self, job: Job, net: Network, latencies=None, seed: int = 0) -> None:
        self.job, self.net = job, net
        self.latencies = None if latencies is None else np.asarray(latencies, np.float64)
        self.rng = np.random.default_rng([seed, 0x1a7])
        self.node = [job.node(r) for r in range(job.ranks)]
        self.out_free = [0.0] * job.k
        self.in_free = [0.0] * job.k
        self.busy_s = 0.0   # link-seconds of transfers between nodes (utilisation)

    def latency(self) -> float:
        """One message's latency: the network's, or one of the measured ``latencies``."""
        if self.latencies is None:
            return self.net.latency
        return float(self.latencies[self.rng.integers(self.latencies.size)])

    def send(self, a: int, b: int, nbytes: float, t: float) -> float:
        """A transfer ready at ``t``: the time it has landed at ``b``."""
        net = self.net
        na, nb = self.node[a], self.node[b]
        if na == nb:
            return t + nbytes / net.shm_bandwidth + self.latency()
        wire = nbytes / net.bandwidth
        self.busy_s += wire if net.shared else 2 * wire   # link-seconds held
        if net.shared:   # one link: the out list's first entry stands for it
            start = max(t, self.out_free[0])
            self.out_free[0] = start + wire
        else:
            start = max(t, self.out_free[na], self.in_free[nb])
            self.out_free[na] = self.in_free[nb] = start + wire
        return start + wire + self.latency()

    def utilisation(self, seconds: float) -> float:
        """Busy fraction of the links over ``seconds``: the shared one, or the mean node link."""
        if seconds <= 0:
            return 0.0
        links = 1 if self.net.shared else 2 * self.job.k
        return self.busy_s / (links * seconds)
