"""Compressed pushes under mpiexec: bsp with fp16 on gradients fp16 holds exactly equals bsp without.

Usage: compress_check.py COMPRESS [--steps N] [--gain MU --lr LR]; rank 0 prints one
``RESULT {json}`` line with the final parameters. Each worker pushes multiples of 1/16 below
64 (exact in float16), and sgd at lr 0.5 keeps every sum and step exact in float32.  With
``--gain``: error feedback on, and the servers' step of ``--momentum-correction gain``
(:func:`psgd.compress.gain.server_step`) for momentum MU at LR.
"""
import argparse
import json

import numpy as np
from mpi4py import MPI

from psgd.protocols.features import CompressionOptions
from psgd.compress.gain import server_step
from psgd.errors import report_and_abort
from psgd.mpi.roles import assign_roles
from psgd.mpi.shardmap import ShardMap
from psgd.protocols.features import make_config
from psgd.ps.server import serve
from psgd.ps.worker import PSWorker

N = 1000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("compress")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--gain", type=float)
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    roles = assign_roles(comm, args.servers)
    smap = ShardMap(N, args.servers)
    optimizer, hparams, schedule = "sgd", {}, lambda c: args.lr
    if args.gain is not None:
        optimizer, hparams, schedule = server_step(args.gain, 0.0, schedule)
    config = make_config("bsp", N, optimizer=optimizer, opt_hparams=hparams,
                         lr_schedule=schedule, compression=CompressionOptions(
                             args.compress, error_feedback="on" if args.gain is not None else "off"))
    init = np.arange(N, dtype=np.float32) / 8
    if roles.is_server:
        result = serve(roles, smap, config, init_shard=smap.view(init, roles.server_index).copy())
        if roles.rank == 0:
            print("RESULT " + json.dumps({"params": result.params.tolist(),
                                          "push_bytes": result.push_bytes}), flush=True)
        return
    rng = np.random.default_rng(roles.worker_index)
    worker = PSWorker(roles, smap, config)
    params = init.copy()
    worker.start(params)
    for c in range(args.steps):
        grad = (rng.integers(-1023, 1024, N) / 16).astype(np.float32)
        worker.step(params, grad, c)
    worker.finish()


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001
        report_and_abort(exc)
