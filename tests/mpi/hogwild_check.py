"""Hogwild under mpiexec: no update lost, reads are mixes of valid states, bad optimizers rejected.

Usage: hogwild_check.py SERVERS STEPS N_PARAMS [--window KIND] [--optimizer NAME]
"""
import argparse
import sys

import numpy as np
from mpi4py import MPI

from psgd.protocols.features import CompensationOptions
from psgd.errors import report_and_abort
from psgd.hogwild.server import serve_hogwild
from psgd.hogwild.worker import HogwildWorker
from psgd.mpi.roles import assign_roles
from psgd.mpi.shardmap import ShardMap
from psgd.nn.optim import make_optimizer
from psgd.protocols.features import make_config

MOMENTUM = 0.5


def initial(n):
    return (np.arange(n) % 7).astype(np.float32)


def expected_total(worker, steps, optimizer):
    """What worker ``worker`` subtracts from every element over ``steps`` updates with lr=1."""
    if optimizer == "sgd":
        return float(worker + 1) * steps
    hparams = {"momentum": MOMENTUM}
    alone = make_optimizer(optimizer, 1, **hparams)
    param = np.zeros(1, np.float32)
    grad = np.full(1, worker + 1, np.float32)
    for _ in range(steps):
        alone.step(param, grad, 1.0)
    return -float(param[0])


def run_worker(roles, shard_map, config, steps, window):
    n = config.n_params
    worker = HogwildWorker(roles, shard_map, config, window=window)
    params = np.full(n, np.nan, dtype=np.float32)
    worker.start(params)
    init = initial(n)
    bound = sum(expected_total(k, steps, config.optimizer) for k in range(roles.n_workers))
    grad = np.full(n, roles.worker_index + 1, dtype=np.float32)
    for clock in range(steps):
        worker.step(params, grad, clock, 1.0)
        taken = init - params
        assert np.isfinite(params).all(), "non-finite parameter read"
        if config.optimizer == "sgd":
            # every element is init minus an integer combination of worker gradients
            assert np.array_equal(taken, np.round(taken)), "a read is not init - integers"
        assert (taken >= 0).all() and (taken <= bound * (1 + 1e-5)).all(), \
            f"a read is outside [init - {bound}, init]: {taken.min()}..{taken.max()}"
    worker.finish()
    stats = worker.stats
    assert stats["n_updates"] == steps
    counts = worker.histogram.counts
    assert counts.sum() == steps, counts
    assert stats["wait_s"] == 0.0 and stats["push_s"] > 0 and stats["pull_s"] > 0
    if roles.n_workers == 1:
        assert counts.tolist() == [steps], counts


def run_server(roles, shard_map, config, steps, window):
    lo, hi = shard_map.range(roles.server_index)
    result = serve_hogwild(roles, shard_map, config, initial(config.n_params)[lo:hi],
                           window=window)
    total_updates = steps * roles.n_workers
    assert result.n_updates == total_updates, result.n_updates
    assert result.cpu_s >= 0 and result.wall_s > 0
    if roles.rank != 0:
        assert result.params is None
        return
    sent = sum(expected_total(k, steps, config.optimizer) for k in range(roles.n_workers))
    expect = initial(config.n_params) - np.float32(sent)
    got = result.params
    if config.optimizer == "sgd":
        assert np.array_equal(got, expect), f"updates lost: max |diff| {np.abs(got - expect).max()}"
    else:
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-4)
    assert result.staleness_hist.dtype == np.int64, result.staleness_hist.dtype
    assert result.staleness_hist.sum() == total_updates
    assert result.n_skipped == 0
    print(f"hogwild ok: S={roles.n_servers} W={roles.n_workers} steps={steps} "
          f"window={result.window} staleness={result.staleness_hist.tolist()} "
          f"server cpu {result.cpu_s:.3f}/{result.wall_s:.3f} s")


def check_rejected(roles, optimizer):
    try:
        make_config("hogwild", 10, optimizer=optimizer)
    except ValueError as exc:
        assert optimizer in str(exc) and "hogwild" in str(exc), str(exc)
        if roles.rank == 0:
            print(f"rejected: {exc}")
        return
    raise AssertionError(f"optimizer {optimizer} was not rejected")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("servers", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("n_params", type=int)
    parser.add_argument("--window", default=None)
    parser.add_argument("--optimizer", default="sgd")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    roles = assign_roles(comm, args.servers)
    hparams = {"momentum": MOMENTUM} if args.optimizer in ("momentum", "nesterov") else {}
    if args.optimizer not in ("sgd", "momentum", "nesterov"):
        check_rejected(roles, args.optimizer)
        return
    config = make_config("hogwild", args.n_params, optimizer=args.optimizer, opt_hparams=hparams,
                         compensation=CompensationOptions("none"))   # the sums below are exact without it
    shard_map = ShardMap(args.n_params, args.servers)
    if roles.is_server:
        run_server(roles, shard_map, config, args.steps, args.window)
    else:
        run_worker(roles, shard_map, config, args.steps, args.window)


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        report_and_abort(exc)
    sys.exit(0)
