"""`psgd plan`: predicted step time, throughput and scaling efficiency of each protocol, and a pick."""
from __future__ import annotations

import argparse
import time

from psgd.errors import PsgdError
from psgd.plan.cost import (NONE, Compression, Job, balanced_servers, expected_touched,
                             predict, recommend)
from psgd.plan.codec import measure_compression
from psgd.plan.inputs import model_of_spec, network_of, parse_bandwidth  # noqa: F401 (simulate's too)

DESCRIPTION = """\
predict each protocol's step time, throughput and scaling efficiency from the model's
size, its compute time per sample, the network and W, S (docs/design/cost-model.md has the equations)

  psgd plan --model mlp:784-1536-512-10 --workers 16,64,256 --bandwidth 10gbit
  psgd plan --params 25e6 --compute-us 2000 --workers 256 --bandwidth 100gbit --per-node 8
  psgd plan --model mlp:784-2048-256-10 --workers 2 --servers 1 --bandwidth 1gbit --compress sign
  psgd plan --model linear:20000-10 --nnz 40 --batch-size 4 --workers 2,8 --compress sparse
  psgd plan --auto --model resnet20 --ranks 8 --memory-per-rank 1G --bandwidth 10gbit
"""

def _batch(model, batch: int, nnz: float | None, rng):
    """A random batch for ``model``: dense, or CSR rows of ``nnz`` uniform features."""
    import numpy as np
    if not getattr(model, "sparse", False):
        return rng.random((batch, *model.input_shape), dtype=np.float32)
    from psgd.data.csr import CSRBatch
    m = max(1, min(int(round(nnz)), model.n_features))
    indices = np.sort(np.stack([rng.choice(model.n_features, m, replace=False)
                                for _ in range(batch)]), axis=1).ravel().astype(np.int32)
    return CSRBatch(np.arange(batch + 1, dtype=np.int64) * m, indices,
                    rng.random(batch * m, dtype=np.float32), model.n_features)


def measure_compute_s(spec: str, batch: int, seconds: float = 2.0, nnz: float | None = None,
                      data: str | None = None) -> float:
    """Seconds per sample of one forward and backward pass of ``spec`` on this core
    (``nnz``: nonzeros per sample of a sparse model's batch; ``data``: the dataset whose
    input shape the model takes)."""
    import numpy as np

    model = model_of_spec(spec, data)
    rng = np.random.default_rng(0)
    x = _batch(model, batch, nnz, rng)
    y = rng.integers(0, model.n_classes, batch)
    model.loss_and_grad(x, y)                        # compile
    steps, start = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - start < seconds:
        model.loss_and_grad(x, y)
        steps += 1
    return (time.perf_counter() - start) / steps / batch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``plan`` parser's flags."""
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", help="a psgd model spec (lenet, mlp:...): its size, and its "
                      "compute time measured here unless --compute-us is given")
    what.add_argument("--params", type=float, help="parameters of a model psgd need not build")
    parser.add_argument("--compute-us", type=float, help="compute time per sample, microseconds")
    parser.add_argument("--nnz", type=float, help="nonzero features per sample, for a sparse "
                        "--model linear:D-K or svm:D-K (its batches touch only their rows)")
    parser.add_argument("--batch-size", "--batch", type=int, default=64,
                        help="per worker (per replica under --auto; default 64)")
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--workers", default="16,64,256,1024", help="comma-separated worker counts")
    count.add_argument("--ranks", type=int, help="ranks in all, --servers of them servers")
    parser.add_argument("--servers", type=int, default=None,
                        help="parameter servers (default: as many as balance worker bandwidth)")
    parser.add_argument("--bandwidth", default="10gbit", help="each node's link (default 10gbit)")
    parser.add_argument("--shm-bandwidth", default="32gbit", help="copies between the ranks "
                        "of one node, as MPI's shared memory makes them (default 32gbit)")
    parser.add_argument("--latency-us", type=float, default=20.0, help="per message (default 20)")
    parser.add_argument("--per-node", type=int, default=1, help="ranks per node (default 1)")
    parser.add_argument("--shared-link", action="store_true",
                        help="all nodes share one link (as psgd net emulates)")
    parser.add_argument("--compress", default="none", help="a psgd train --compress spec: "
                        "pushes and the all-reduce scaled by its ratio, plus its encode and "
                        "decode time, both measured here (default none)")
    parser.add_argument("--compress-bucket", type=int, default=512,
                        help="as psgd train's (default 512)")
    from psgd.plan.auto import add_arguments as auto_arguments
    auto_arguments(parser)


def _jobs(args, n_params: int, compute_s: float, bandwidth: float,
          compression: Compression = NONE, touched: float | None = None):
    if args.ranks is not None:
        if args.servers is None or not 0 <= args.servers < args.ranks:
            raise PsgdError(f"--ranks {args.ranks} needs --servers S with 0 <= S < {args.ranks} "
                            f"(at least one worker)")
        counts = [(args.ranks - args.servers, args.servers)]
    else:
        try:
            workers = [int(w) for w in args.workers.split(",")]
        except ValueError:
            raise PsgdError(f"--workers {args.workers!r} is not a list of counts") from None
        counts = [(w, balanced_servers(w, bandwidth, bandwidth) if args.servers is None
                   else args.servers) for w in workers]
    for w, s in counts:
        if w < 1 or s < 0:
            raise PsgdError(f"need >= 1 worker and >= 0 servers, got {w} and {s}")
        yield Job(n_params, compute_s, args.batch_size, w, s, args.per_node,
                  compression=compression, touched=touched)


def _touched(args, model) -> float | None:
    """Coordinates a sparse model's batch touches; None for a dense one."""
    if not getattr(model, "sparse", False):
        if args.nnz is not None:
            raise PsgdError("--nnz describes sparse data: give --model linear:D-K or svm:D-K")
        return None
    if args.nnz is None or not args.nnz > 0:
        raise PsgdError(f"--model {args.model} needs --nnz N > 0, the nonzero features per sample")
    return expected_touched(model.n_features, model.n_classes, args.nnz, args.batch_size)


def run(args: argparse.Namespace) -> None:
    if args.auto:
        from psgd.plan.auto import run_auto
        return run_auto(args)
    if args.per_node < 1 or args.batch_size < 1:
        raise PsgdError("--per-node and --batch-size must be >= 1")
    model = model_of_spec(args.model, args.data) if args.model else None
    n_params = model.n_params if model else int(args.params)
    touched = _touched(args, model)
    if args.compute_us is not None:
        compute_s = args.compute_us * 1e-6
    elif args.model:
        compute_s = measure_compute_s(args.model, args.batch_size, nnz=args.nnz, data=args.data)
    else:
        raise PsgdError("--params needs --compute-us (only a --model can be measured here)")
    net = network_of(args)
    compression = measure_compression(args.compress, args.compress_bucket, n_params,
                                      touched=touched)
    jobs = list(_jobs(args, n_params, compute_s, net.bandwidth, compression, touched))
    print(f"{args.model or f'{n_params:.3g} parameters'}: {n_params} parameters "
          f"({4 * n_params / 2**20:.1f} MB), {compute_s * 1e6:.0f} us per sample, batch "
          f"{args.batch_size}; {args.bandwidth} {'shared link' if net.shared else 'per node'}, "
          f"{args.latency_us:g} us, {args.per_node} rank(s) per node")
    if touched is not None:
        print(f"sparse: a batch of {args.batch_size} x {args.nnz:g} nonzeros touches about "
              f"{touched:.0f} coordinates ({touched / n_params:.2%}); a hogwild update and read "
              f"move {jobs[0].update_bytes:.0f} bytes (index + value) each")
    if compression != NONE:
        c = compression
        print(f"--compress {args.compress}: {c.ratio:.1f}x fewer bytes per push (pulls float32), "
              f"encode {4e-9 / c.encode_s:.2f} GB/s, decode {4e-9 / c.decode_s:.2f} GB/s of "
              f"float32 (measured here)")
    print(f"{'W':>5} {'S':>5} | {'protocol':<23} {'step ms':>9} {'samples/s':>11} "
          f"{'efficiency':>10}")
    for job in jobs:
        try:
            predicted = predict(job, net)
        except ValueError as exc:
            raise PsgdError(str(exc)) from None
        pick = recommend(predicted)
        for name, p in predicted.items():
            mark = "  <- recommended" if name == pick else ""
            print(f"{job.workers:>5} {job.servers:>5} | {name:<23} {p['step_s'] * 1e3:9.2f} "
                  f"{p['samples_per_s']:11.0f} {p['efficiency']:9.0%}{mark}")
