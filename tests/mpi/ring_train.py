"""Allreduce training with SGD equals single-process SGD on the concatenated batches; replicas stay identical."""

import numpy as np
from mpi4py import MPI
from reference import softmax_grad

from psgd.collectives.allreduce import auto_algorithm
from psgd.collectives.allreduce_worker import AllreduceWorker
from psgd.errors import PsgdError, report_and_abort
from psgd.mpi.roles import assign_roles
from psgd.nn.optim import make_optimizer
from psgd.protocols.features import make_config

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()


def use(c):
    """Train on communicator ``c`` (COMM_WORLD, or one of ring_suite.py's sub-communicators)."""
    global comm, rank, size
    comm, rank, size = c, c.Get_rank(), c.Get_size()
D, C, B, STEPS = 20, 5, 8, 60        # features, classes, rows per worker per step, steps
N = D * C + C


def dataset(steps):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((steps, size * B, D)).astype(np.float32)
    y = rng.integers(0, C, size=(steps, size * B))
    return x, y


def train_allreduce(name, x, y):
    params = np.random.default_rng(100 + rank).standard_normal(N).astype(np.float32)
    worker = AllreduceWorker(assign_roles(comm, 0), None, make_config("allreduce", N, optimizer=name),
                             check_every=7)
    worker.start(params)                        # rank 0's random init wins everywhere
    mine = slice(rank * B, (rank + 1) * B)
    for step in range(len(x)):
        worker.step(params, softmax_grad(params, x[step, mine], y[step, mine], C), step, 0.1)
    stats = worker.finish()
    assert stats["steps"] == len(x) and stats["checks"] == len(x) // 7 + 1, stats
    assert stats["step_s"] >= stats["allreduce_s"] > 0, stats
    return params


def train_single(name, x, y):
    params = np.random.default_rng(100).standard_normal(N).astype(np.float32)
    opt = make_optimizer(name, N)
    for step in range(len(x)):
        opt.step(params, softmax_grad(params, x[step], y[step], C), 0.1)
    return params


def check_divergence_is_named():
    params = np.ones(N, np.float32)
    worker = AllreduceWorker(assign_roles(comm, 0), None, make_config("allreduce", N))
    worker.check_replicas(params)
    if size < 2:
        return
    bad = size - 1
    if rank == bad:
        params[3] += 1e-3
    try:
        worker.check_replicas(params)
    except PsgdError as exc:
        assert f"worker(s) {bad} hold" in str(exc), str(exc)
    else:
        raise AssertionError("diverged replica not detected")


def main():
    algorithm = auto_algorithm(comm, np.empty(N, np.float32))    # what the worker's calls take
    x, y = dataset(STEPS)
    for name in ("sgd", "momentum"):
        got = train_allreduce(name, x, y)
        first = got.copy()
        comm.Bcast(first, root=0)
        assert np.array_equal(got, first), f"{name}: replicas differ after training"
        want = train_single(name, x, y)
        err = np.max(np.abs(got - want) / (1 + np.abs(want)))
        assert err < 2e-5, f"{name}: allreduce training differs from single-process by {err}"
        if rank == 0:
            print(f"{name}: max relative difference to single-process {err:.2e}")
    check_divergence_is_named()
    if rank == 0:
        print(f"ring_train: passed on {size} ranks, all-reduce {algorithm}")


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - one failing rank ends the job
        report_and_abort(exc)
