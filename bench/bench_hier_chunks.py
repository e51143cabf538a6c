"""The hierarchical all-reduce unpipelined and pipelined at several chunk sizes, beside
MPI_Allreduce, in one job: batches of back-to-back calls of each alternate, so all see the
same load (on a shared machine, separate runs differ more than the methods do).

``make bench-hier-chunks`` (root) runs it as ``psgd net --nodes 2 --rate 10gbit --
mpiexec -n 4 python bench/bench_hier_chunks.py --rank`` (``--nodes``, ``--rate``, ``--ranks``)
and writes the lines into runs/bench/hier-chunks-TIME/hier-chunks.md (--publish:
bench/results/). Prints per size the median (and fastest) batch's time per call of the slowest rank and
its bus-bandwidth ratio to MPI_Allreduce (> 1: psgd faster); ``c0K`` is unpipelined.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

BATCH_S = 0.02                             # seconds of calls per batch, roughly


def launch(args) -> None:
    """Run the ranks on ``psgd net``'s emulated nodes; write what rank 0 printed."""
    out = common.out_dir(args, "hier-chunks")
    cmd = [sys.executable, "-m", "psgd", "net", "--nodes", str(args.nodes), "--rate", args.rate,
           "--", common.mpiexec(), "-n", str(args.ranks), sys.executable,
           str(Path(__file__).resolve()), "--rank", "--sizes", args.sizes, "--chunks",
           args.chunks, "--repeats", str(args.repeats)]
    proc = common.run_bounded(cmd, 900, cwd=common.ROOT)
    print(proc.stdout, end="")
    if proc.returncode != 0:
        raise SystemExit(f"bench_hier_chunks: exit {proc.returncode}:\n{proc.stderr}")
    text = (f"{args.ranks} ranks on {args.nodes} nodes at {args.rate}; per size, per method: "
            f"median batch time per call (fastest), x: MPI's median over it\n\n"
            + "\n".join(f"- {line}" for line in proc.stdout.splitlines()))
    print(f"wrote {common.write_text(out / 'hier-chunks.md', text, common.NO_DATA)}")


def batch_time(comm, fn, calls: int) -> float:
    """Seconds per call over ``calls`` back-to-back calls, the slowest rank's."""
    from mpi4py import MPI
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t = np.array([(time.perf_counter() - t0) / calls])
    comm.Allreduce(MPI.IN_PLACE, t, op=MPI.MAX)
    return float(t[0])


def measure(comm, nbytes: int, chunks: list[int], repeats: int) -> dict[str, list[float]]:
    from mpi4py import MPI

    from psgd.collectives.allreduce import allreduce
    buf = np.random.default_rng(comm.Get_rank()).standard_normal(nbytes // 4).astype(np.float32)
    fns = {f"c{cb >> 10}K": (lambda cb=cb: allreduce(comm, buf, chunk_bytes=cb)) for cb in chunks}
    fns["mpi"] = lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    for fn in fns.values():
        fn()                               # first calls build the schedules
    calls = max(3, int(BATCH_S / (2 * nbytes / 1.25e9)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(batch_time(comm, fn, calls))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1048576,4194304,16777216", help="bytes, comma-separated")
    ap.add_argument("--chunks", default="0,262144,524288,1048576",
                    help="chunk bytes to compare, comma-separated (0: unpipelined)")
    ap.add_argument("--repeats", type=int, default=7, help="batches of each method per size")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    common.add_output_arguments(ap)
    args = ap.parse_args()
    if not args.rank:
        return launch(args)
    from mpi4py import MPI
    np.seterr(all="ignore")                # repeated sums grow to inf, the same for all
    comm = MPI.COMM_WORLD
    for nbytes in map(int, args.sizes.split(",")):
        times = measure(comm, nbytes, [int(c) for c in args.chunks.split(",")], args.repeats)
        if comm.Get_rank() == 0:
            mpi = float(np.median(times["mpi"]))
            print(f"{nbytes >> 20} MB: " + ", ".join(
                f"{name} {np.median(t) * 1e3:.2f} ms (min {min(t) * 1e3:.2f}, "
                f"x{mpi / np.median(t):.2f})" for name, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
