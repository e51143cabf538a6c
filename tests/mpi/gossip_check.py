"""Gossip (D-PSGD) and AD-PSGD on quadratic losses against numpy references, on every topology."""
import sys

import numpy as np
from mpi4py import MPI

from psgd.config import ProtocolConfig
from psgd.errors import report_and_abort
from psgd.gossip import adpsgd, topology
from psgd.gossip.adpsgd import AdpsgdWorker
from psgd.gossip.dpsgd import GossipWorker
from psgd.mpi.roles import assign_roles

N = 1001
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
roles = assign_roles(comm, 0)


def every(x):
    """Every worker's vector, as rows of a float64 (size, n) array."""
    out = np.empty((size, x.size), x.dtype)
    comm.Allgather(x, out)
    return out.astype(np.float64)


def quadratic(r):
    """Worker r's loss 0.5 * sum(a * x**2) - b.x: its gradient a * x - b (float32)."""
    rng = np.random.default_rng(100 + r)
    return (rng.uniform(0.5, 2.0, N).astype(np.float32), rng.standard_normal(N).astype(np.float32))


def grad_at(x, r):
    a, b = quadratic(r)
    return (a * x - b).astype(np.float32)


def start_models(seed):
    return [np.random.default_rng(seed * 1000 + r).standard_normal(N).astype(np.float32)
            for r in range(size)]


def roundoff(x):
    return 8 * size * np.finfo(np.float32).eps * (1 + np.abs(x).max())


def check_gossip(name, lr, steps):
    config = ProtocolConfig(protocol="gossip", n_params=N, topology=name)
    worker = GossipWorker(roles, None, config)
    models = start_models(len(name))
    params = models[rank].copy()
    worker.start(params, same=False)
    reference = np.array(models, np.float64)
    matrix = topology.mixing_matrix(name, size)
    out = np.empty(N, np.float32)
    distances = [worker.average(params, out)]
    for clock in range(steps):
        before = every(params)
        grads = every(grad_at(params, rank))
        worker.step(params, grad_at(params, rank), clock, lr)
        after = every(params)
        # the average moves exactly as x_avg - lr * mean_i g_i(x_i); the mixing preserves it
        want = before.mean(0) - lr * grads.mean(0)
        err = np.abs(after.mean(0) - want).max()
        assert err <= roundoff(before), f"{name} clock {clock}: average off by {err}"
        reference = matrix @ reference - lr * np.array([grad_at(reference[r].astype(np.float32), r)
                                                        for r in range(size)])
        err = np.abs(after - reference).max()
        assert err <= 1e-4 * (1 + np.abs(reference).max()), f"{name} clock {clock}: {err} off D-PSGD"
        distances.append(worker.average(params, out))
    assert np.allclose(out, after.mean(0), atol=roundoff(after)), name
    worker.finish()
    return distances


def check_consensus():
    for name in topology.TOPOLOGIES:
        try:
            topology.mixing_matrix(name, size)
        except ValueError:
            continue
        distances = check_gossip(name, lr=0.0, steps=60)
        assert distances[-1] <= 1e-8 * distances[0], f"{name}: no consensus {distances[::10]}"
        if name == "complete":   # one step of the complete graph is the exact average
            assert distances[1] <= 1e-10 * distances[0], distances[:2]
        if rank == 0:
            print(f"gossip {name} W={size} lr=0: distance {distances[0]:.3g} -> "
                  f"{distances[-1]:.3g}", flush=True)
        check_gossip(name, lr=0.1, steps=10)


def check_adpsgd_ordered(name, steps=20, lr=0.1):
    config = ProtocolConfig(protocol="adpsgd", n_params=N, topology=name, seed=7)
    worker = AdpsgdWorker(roles, None, config, ordered=True)
    models = start_models(3)
    params = models[rank].copy()
    worker.start(params, same=False)
    # the serial reference: each clock, every worker's gradient at its model, then each
    # active worker averages with the neighbour it draws, then every worker steps
    partners = adpsgd.partners(name, size)
    reference = [m.copy() for m in models]
    for clock in range(steps):
        grads = [grad_at(reference[r], r) for r in range(size)]
        for active in range(0, size, 2):
            j = adpsgd.choose(7, clock, active, partners[active])
            mean = (reference[active] + reference[j]) * np.float32(0.5)
            reference[active], reference[j] = mean.copy(), mean.copy()
        reference = [(reference[r] - np.float32(lr) * grads[r]).astype(np.float32)
                     for r in range(size)]
        worker.step(params, grad_at(params, rank), clock, lr)
    worker.finish()
    err = np.abs(params - reference[rank]).max()
    assert err <= roundoff(reference[rank]), f"adpsgd ordered {name}: worker {rank} off by {err}"


def check_adpsgd_consensus(name, steps=200):
    config = ProtocolConfig(protocol="adpsgd", n_params=N, topology=name, seed=3)
    worker = AdpsgdWorker(roles, None, config)
    params = start_models(5)[rank].copy()
    worker.start(params, same=False)
    first = every(params).mean(0)
    out = np.empty(N, np.float32)
    d0 = worker.average(params, out)
    zero = np.zeros(N, np.float32)
    for clock in range(steps):
        worker.step(params, zero, clock, 0.0)
        if clock == steps // 2:   # a collective while others still pair
            worker.average(params, out)
    worker.finish()
    d1 = worker.average(params, out)
    err = np.abs(out - first).max()
    assert err <= 4 * roundoff(first), f"adpsgd {name}: the average moved by {err}"
    assert d1 <= 1e-6 * d0, f"adpsgd {name}: distance {d0} -> {d1}"
    if rank == 0:
        print(f"adpsgd {name} W={size} lr=0: distance {d0:.3g} -> {d1:.3g}, "
              f"{worker.stats['averages']} averages on worker 0", flush=True)


try:
    check_consensus()
    if size >= 2:
        for name in ("ring", "complete", "exponential"):
            check_adpsgd_ordered(name)
        check_adpsgd_consensus("ring")
    if rank == 0:
        print("gossip ok", flush=True)
except Exception:
    report_and_abort(sys.exc_info()[1])
