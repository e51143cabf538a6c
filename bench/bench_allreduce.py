"""Latency and bus bandwidth of psgd's all-reduce beside MPI's own Allreduce, at 2 and 4 ranks.

Run as ``python bench/bench_allreduce.py`` (``make bench-allreduce``): it launches
itself under ``mpiexec -n R`` for each R in ``--ranks`` and prints one table per
rank count, and writes allreduce.json into runs/bench/allreduce-TIME/ (``--publish``:
bench/results/; ``--json PATH``: there only).  Bus bandwidth is 2(N-1)/N x bytes / time (the bytes each rank moves
on a bandwidth-optimal ring).  Method as in the OSU micro-benchmarks: a sample
is a batch of back-to-back calls on the same buffer (about 10 ms of them, after
a barrier and one untimed call), its time per call is the slowest rank's;
samples of the three methods alternate until the time budget is spent, and
the table shows the median sample (and the ratio of the fastest ones).

The methods: ``psgd`` is ``allreduce`` as training calls it (``auto``,
or ``--algorithm``; the ``algo`` column says what it took: on one node, the
shared-memory window up to 4 MB); ``p2p`` is ``auto`` kept to messages
(``shared_bytes=0``), what runs across nodes: recursive doubling below 256 KB,
the ring from there; ``mpi`` is MPICH's ``MPI_Allreduce``.  float32 buffers
of random values; repeated sums grow (and may reach inf: adds on inf run at
full speed), the same for all.  Ratios: > 1 means psgd is faster.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402

DEFAULT_SIZES = [4 ** k * 1024 for k in range(1, 10)]          # 4 KB .. 64 MB (+256 MB cut below)
DEFAULT_SIZES = [s for s in DEFAULT_SIZES if s <= 64 * 2 ** 20]


def _fmt_bytes(n: int) -> str:
    for unit, scale in (("MB", 2 ** 20), ("KB", 2 ** 10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


SAMPLE_S = 0.01                            # seconds of back-to-back calls per sample


def _batch_size(comm, fn, target: float) -> int:
    """Calls per timed sample, so that a sample lasts about ``target`` seconds (same on all ranks)."""
    import numpy as np
    from mpi4py import MPI
    fn()                                   # warm-up: caches, scratch, first-call Dup
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    k = np.array([max(1, min(2000, int(target / max(time.perf_counter() - t0, 1e-7))))])
    comm.Allreduce(MPI.IN_PLACE, k, op=MPI.MIN)
    return int(k[0])


def _sample(comm, fn, k: int) -> float:
    """Seconds per call over k back-to-back calls (after one untimed call and a barrier)."""
    fn()
    comm.Barrier()                         # MPI's own (spinning) barrier: ranks leave together
    t0 = time.perf_counter()
    for _ in range(k):
        fn()
    return (time.perf_counter() - t0) / k


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    from psgd.collectives.allreduce import allreduce, auto_algorithm
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    kw = {}
    if args.algorithm:
        kw["algorithm"] = args.algorithm
    for flag in ("segment_bytes", "small_bytes", "shared_bytes"):
        if getattr(args, flag) is not None:
            kw[flag] = getattr(args, flag)
    p2p_kw = {k: v for k, v in kw.items() if k != "algorithm"} | {"shared_bytes": 0}
    np.seterr(over="ignore", invalid="ignore")   # repeated sums grow; inf/nan add at full speed
    rows = []
    for nbytes in args.sizes:
        n = nbytes // 4
        work = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
        methods = {"psgd": lambda: allreduce(comm, work, "sum", **kw),
                   "p2p": lambda: allreduce(comm, work, "sum", **p2p_kw),
                   "mpi": lambda: comm.Allreduce(MPI.IN_PLACE, work, op=MPI.SUM)}
        algorithm = args.algorithm or auto_algorithm(comm, work, args.small_bytes,
                                                     args.shared_bytes)
        ks = {name: _batch_size(comm, fn, SAMPLE_S) for name, fn in methods.items()}
        times = {name: [] for name in methods}
        start = time.perf_counter()
        go = np.ones(1, dtype=np.int32)
        while go[0]:                       # the methods alternate, so all see the same load
            for name, fn in methods.items():
                times[name].append(_sample(comm, fn, ks[name]))
            reps = len(times["mpi"])
            go[0] = reps < 5 or (reps < 500 and time.perf_counter() - start < 2 * args.seconds)
            comm.Allreduce(MPI.IN_PLACE, go, op=MPI.MIN)     # all ranks stop together
        row = {"ranks": size, "bytes": nbytes, "algorithm": algorithm, "repeats": len(times["mpi"])}
        for name in methods:
            t = np.array(times[name])
            comm.Allreduce(MPI.IN_PLACE, t, op=MPI.MAX)
            row[f"{name}_s"] = float(np.median(t))
            row[f"{name}_best_s"] = float(np.min(t))
            row[f"{name}_busbw_GBs"] = 2 * (size - 1) / size * nbytes / row[f"{name}_s"] / 1e9
        rows.append(row)
    if rank == 0:
        Path(args.rows).write_text(json.dumps(rows))


def _target(row, name: str = "psgd") -> str:
    """The issue's targets: latency within 1.5x of MPI's at 4 KB, >= 1.1x its bus bandwidth from 1 MB."""
    if row["bytes"] == 4096:
        return "ok" if row[f"{name}_s"] <= 1.5 * row["mpi_s"] else "MISS"
    if row["bytes"] >= 2 ** 20:
        return "ok" if row["mpi_s"] >= 1.1 * row[f"{name}_s"] else "MISS"
    return ""


def print_table(rows) -> None:
    print(f"\nranks={rows[0]['ranks']}  (float32, sum; median sample, slowest rank; bw x/MPI = "
          f"bus bandwidth ratio, > 1: psgd faster; 'best' = ratio of the fastest samples)")
    print(f"{'size':>7} {'algo':>8} | {'psgd us':>9} {'p2p us':>9} {'MPI us':>9} | "
          f"{'psgd GB/s':>9} {'MPI GB/s':>9} | {'bw psgd/MPI':>11} {'best':>5} {'target':>6} | "
          f"{'bw p2p/MPI':>11} {'target':>6}")
    for r in rows:
        print(f"{_fmt_bytes(r['bytes']):>7} {r['algorithm']:>8} | {r['psgd_s'] * 1e6:9.1f} "
              f"{r['p2p_s'] * 1e6:9.1f} {r['mpi_s'] * 1e6:9.1f} | {r['psgd_busbw_GBs']:9.2f} "
              f"{r['mpi_busbw_GBs']:9.2f} | {r['mpi_s'] / r['psgd_s']:11.2f} "
              f"{r['mpi_best_s'] / r['psgd_best_s']:5.2f} {_target(r):>6} | "
              f"{r['mpi_s'] / r['p2p_s']:11.2f} {_target(r, 'p2p'):>6}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    ap.add_argument("--sizes", default=None,
                    help="comma-separated sizes in bytes (default 4 KB..64 MB, powers of 4)")
    ap.add_argument("--seconds", type=float, default=0.5, help="time budget per size and method")
    ap.add_argument("--quick", action="store_true", help="0.1 s per size and method")
    ap.add_argument("--json", default=None, help="write all results to this path (only)")
    common.add_output_arguments(ap)
    ap.add_argument("--algorithm", default=None, help="force allreduce's algorithm")
    ap.add_argument("--segment-bytes", type=int, default=None)
    ap.add_argument("--small-bytes", type=int, default=None)
    ap.add_argument("--shared-bytes", type=int, default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    if args.quick:
        args.seconds = 0.1
    if args.worker:
        worker(args)
        return
    mpiexec = common.mpiexec()
    path = Path(args.json) if args.json else common.out_dir(args, "allreduce") / "allreduce.json"
    results = []
    for ranks in [int(r) for r in args.ranks.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            cmd = [mpiexec, "-n", str(ranks), sys.executable, str(Path(__file__).resolve()),
                   "--worker", "--rows", str(out), "--seconds", str(args.seconds),
                   "--sizes", ",".join(map(str, args.sizes))]
            for flag in ("algorithm", "segment_bytes", "small_bytes", "shared_bytes"):
                if getattr(args, flag) is not None:
                    cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            subprocess.run(cmd, check=True, cwd=ROOT)
            rows = json.loads(out.read_text())
        print_table(rows)
        results.extend(rows)
    common.write_json(path, {"rows": results}, common.NO_DATA)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
