"""Compressed all-reduce under mpiexec: each compressor's allreduce run of a few sgd steps.

Usage: compress_ring_check.py SPEC [SPEC ...]; rank 0 prints one ``RESULT {json}`` line:
per spec, worker 0's final parameters, whether every worker's are bitwise the same, and
(``serial``) the parameters a serial replay gives: each worker's frames encoded as it encodes
them, decoded and summed in rank order, their mean taken (what the all-gather path computes).
Gradients are multiples of 1/16 below 16 (with 4 workers every partial sum and the mean
are exact in float16), and sgd at lr 0.5 keeps every step exact in float32.
"""
import argparse
import json

import numpy as np
from mpi4py import MPI

from psgd.collectives.allreduce_worker import AllreduceWorker
from psgd.collectives.compressed import _Whole
from psgd.compress import make
from psgd.compress.feedback import PushEncoder
from psgd.protocols.features import CompressionOptions
from psgd.errors import report_and_abort
from psgd.mpi.roles import assign_roles
from psgd.protocols.features import make_config

N = 1001          # chunks of unequal length


def serial(config, workers: int, steps: int) -> list:
    """The all-gather's arithmetic on one process: every worker's encoder and gradients."""
    coding = config.compression
    encoders = [PushEncoder(make(coding.compress, coding.compress_bucket,
                                 seed=config.seed * 100_003 + w + 1), _Whole(N), coding.feedback)
                for w in range(workers)]
    rngs = [np.random.default_rng(w) for w in range(workers)]
    params = np.arange(N, dtype=np.float32) / 8
    for _ in range(steps):
        frames = [e.encode((r.integers(-255, 256, N) / 16).astype(np.float32))[0].copy()
                  for e, r in zip(encoders, rngs)]
        total = np.zeros(N, np.float32)
        for w, frame in enumerate(frames):
            encoders[w].compressor.decode_add(frame, total)
        np.divide(total, workers, out=total)
        params -= np.float32(0.5) * total
    return params.tolist()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("specs", nargs="+")
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    roles = assign_roles(comm, 0)
    out = {}
    for spec in args.specs:
        config = make_config("allreduce", N, optimizer="sgd", seed=3, compression=CompressionOptions(
                                 spec, error_feedback="on" if spec.startswith(("sign", "topk:0")) else "off"))
        rng = np.random.default_rng(roles.worker_index)
        worker = AllreduceWorker(roles, None, config)
        params = np.arange(N, dtype=np.float32) / 8
        worker.start(params)
        for c in range(args.steps):
            grad = (rng.integers(-255, 256, N) / 16).astype(np.float32)
            worker.step(params, grad, c, 0.5)
        worker.finish(params)          # raises if the replicas differ
        every = comm.gather(params.tobytes(), root=0)
        if comm.Get_rank() == 0:
            out[spec] = {"params": params.tolist(), "same": len(set(every)) == 1,
                         "push_bytes": worker.stats.get("push_bytes", 0),
                         "serial": None if spec in ("none", "fp16") else
                         serial(config, comm.Get_size(), args.steps)}
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001
        report_and_abort(exc)
