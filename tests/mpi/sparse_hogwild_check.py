"""Sparse hogwild under mpiexec: only touched rows move, no update lost, lazy decay and momentum equal eager.

Each step the worker reads only its batch's rows (the rest of its vector stays NaN), at
index + value bytes each; with one worker and no decay the rows read equal the servers' values
(plain SGD). With momentum or Nesterov each worker's constant gradients move the servers'
vector by that worker's eager momentum trajectory, so the final vector is known for any W
(with decay or a schedule for W = 1); a push carries the batch's rows, or on a step where
the momentum's products restart, those and the rows caught up.

Usage: sparse_hogwild_check.py SERVERS STEPS N_ROWS ROW_LEN [--decay LAMBDA]
       [--optimizer sgd|momentum|nesterov] [--schedule constant|cosine]
"""
import argparse
import sys

import numpy as np
from mpi4py import MPI

from psgd.protocols.features import CompensationOptions
from psgd.errors import report_and_abort
from psgd.hogwild.server import serve_hogwild
from psgd.hogwild.worker import HogwildWorker
from psgd.hogwild.sparse import INDEX_BYTES
from psgd.mpi.roles import assign_roles
from psgd.mpi.shardmap import ShardMap
from psgd.nn.optim import make_schedule
from psgd.protocols.features import make_config

MOMENTUM = 0.9


class RowsModel:
    """What the sparse hogwild path reads of a model: the touched rows and their length; a
    batch here is its rows."""
    sparse = True

    def __init__(self, row_len):
        self.row_len, self.touched = row_len, np.zeros(0, np.int64)

    def rows_of(self, batch):
        return batch


def rows_of(worker, step, n_rows):
    rng = np.random.default_rng([worker, step])
    return np.sort(rng.choice(n_rows, size=int(rng.integers(1, 6)), replace=False)).astype(np.int64)


def initial(n):
    return (np.arange(n) % 7).astype(np.float32)


def expected(n_workers, steps, n_rows, k, decay, lrs, optimizer):
    """Every worker's constant gradient (worker + 1) on its rows, summed; with decay (one worker)
    eager SGD; with momentum the sum of each worker's eager (numpy, float64) trajectory."""
    w0 = initial(n_rows * k).reshape(n_rows, k).astype(np.float64)
    total = w0.copy()
    for worker in range(n_workers):
        w, v = (w0.copy(), np.zeros_like(w0)) if optimizer != "sgd" else (total, None)
        for step in range(steps):
            g = np.zeros_like(w)
            g[rows_of(worker, step, n_rows)] = worker + 1
            lr = lrs[step]
            if optimizer == "sgd":
                w = (1 - lr * decay) * w - lr * g
                continue
            g = g + decay * w
            v = MOMENTUM * v + g
            w = w - lr * (g + MOMENTUM * v if optimizer == "nesterov" else v)
        total = w if optimizer == "sgd" else total + (w - w0)
    return total.ravel()


def main():
    parser = argparse.ArgumentParser()
    for name in ("servers", "steps", "n_rows", "row_len"):
        parser.add_argument(name, type=int)
    parser.add_argument("--decay", type=float, default=0.0)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--schedule", default="constant")
    args = parser.parse_args()
    roles = assign_roles(MPI.COMM_WORLD, args.servers)
    n, k = args.n_rows * args.row_len, args.row_len
    sgd = args.optimizer == "sgd"
    schedule = make_schedule(args.schedule, (0.25 if args.decay else 1.0) * (1 if sgd else 0.1),
                             args.steps)
    lrs = [schedule(step) for step in range(args.steps)]
    hparams = {"weight_decay": args.decay, **({} if sgd else {"momentum": MOMENTUM})}
    config = make_config("hogwild", n, optimizer=args.optimizer, opt_hparams=hparams,
                         compensation=CompensationOptions("none"))
    shard_map = ShardMap(n, args.servers)
    if roles.is_server:
        lo, hi = shard_map.range(roles.server_index)
        result = serve_hogwild(roles, shard_map, config, initial(n)[lo:hi])
        if roles.rank == 0:
            want = expected(roles.n_workers, args.steps, args.n_rows, k, args.decay, lrs,
                            args.optimizer)
            if args.decay or not sgd or args.schedule != "constant":
                np.testing.assert_allclose(result.params, want, rtol=1e-5, atol=1e-5)
            else:
                assert np.array_equal(result.params, want.astype(np.float32)), \
                    f"updates lost: max |diff| {np.abs(result.params - want).max()}"
            print(f"sparse hogwild ok: S={roles.n_servers} W={roles.n_workers} decay={args.decay} "
                  f"{args.optimizer} {args.schedule}")
        return
    model = RowsModel(k)
    worker = HogwildWorker(roles, shard_map, config)
    worker.use_model(model)
    params = np.zeros(n, np.float32)
    grad = np.zeros(n, np.float32)
    worker.start(params)
    window = initial(n).astype(np.float64)   # the servers' values while this is the only worker
    sweeps = 0
    for step in range(args.steps):
        rows = rows_of(roles.worker_index, step, args.n_rows)
        params[:] = np.nan
        read = worker.stats["pull_bytes"]
        worker.before_batch(params, rows)
        assert worker.stats["pull_bytes"] - read == len(rows) * k * (4 + INDEX_BYTES)
        mine = np.zeros((args.n_rows, k), bool)
        mine[rows] = True
        mine = mine.ravel()
        assert np.isfinite(params[mine]).all() and np.isnan(params[~mine]).all(), \
            f"step {step}: read other coordinates than rows {rows}"
        if roles.n_workers == 1 and not args.decay and sgd:
            assert np.array_equal(params[mine], window[mine].astype(np.float32)), \
                f"step {step}: rows {rows} read {params[mine]}, the servers hold {window[mine]}"
        grad.reshape(-1, k)[model.touched] = 0
        model.touched = rows
        grad.reshape(-1, k)[rows] = roles.worker_index + 1
        window -= lrs[step] * grad
        before = worker.stats["push_bytes"]
        worker.step(params, grad, step, lrs[step])
        extra = worker.stats["push_bytes"] - before - len(rows) * k * (4 + INDEX_BYTES)
        restarted = not sgd and worker._sparse.lazy.t == 0
        sweeps += restarted
        assert extra == 0 or (restarted and 0 < extra <= n * (4 + INDEX_BYTES)
                              and extra % (k * (4 + INDEX_BYTES)) == 0), \
            f"step {step}: pushed {extra} bytes beyond its rows"
    assert sgd or args.steps < 100 or sweeps, "no restart of the momentum products"
    params[:] = np.nan
    worker.read_all(params)
    if roles.n_workers == 1 and not args.decay and sgd:
        assert np.array_equal(params, window.astype(np.float32)), "read_all differs from the servers"
    worker.finish()
    assert worker.stats["n_updates"] == args.steps


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
        report_and_abort(exc)
    sys.exit(0)
