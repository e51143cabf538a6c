"""Hogwild's one-sided ops across emulated nodes: Accumulate and Get times against the poll.

Rank 0 holds an ``MPI_Win_allocate`` window of ``--mb`` MB and polls MPI (a test
of a barrier) with a sleep of ``--poll`` seconds between tests, as a hogwild server
does; ranks 1.. (``--active`` of them) each Accumulate the whole window and Flush,
then Get it and Flush, ``--reps`` times, with ``--compute`` seconds of spinning
before each pair (a worker's step). Rank 1 first times a Send and Recv of the same
bytes with rank 0, alone. Each row runs under ``psgd net`` (root); the table prints the
median op times after the first quarter, the bytes over them and rank 0's CPU share,
written as rma.{md,json} into runs/bench/rma-TIME/ (``--publish``: bench/results/).

    make bench-rma ARGS="--rate 10gbit"
    python bench/bench_rma.py --rate 10gbit --polls 0,5e-5,1e-3
    python bench/bench_rma.py --nodes 4 --ranks 4 --active 3 --compute 0.016
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402

PY = sys.executable


def serve(comm, n: int, poll: float) -> dict:
    """Rank 0: answer rank 1's ping-pong, then poll until the others are done."""
    buf = np.empty(n, np.float32)
    for _ in range(3):
        comm.Recv(buf, 1)
        comm.Send(buf, 1)
    comm.Barrier()
    request = comm.Ibarrier()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    while not request.Test():
        if poll > 0:
            time.sleep(poll)
    return {"server_cpu": (time.process_time() - cpu0) / (time.perf_counter() - wall0)}


def pingpong(comm, buf: np.ndarray) -> float:
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        comm.Send(buf, 0)
        comm.Recv(buf, 0)
        best = min(best, time.perf_counter() - t)
    return best


def ops(win, buf: np.ndarray, reps: int, compute: float) -> tuple[list, list]:
    """Accumulate + Flush and Get + Flush of ``buf`` into rank 0's window, ``reps`` times."""
    from mpi4py import MPI
    acc, get = [], []
    win.Lock_all()
    for _ in range(reps):
        t = time.perf_counter()
        while time.perf_counter() - t < compute:
            pass
        t0 = time.perf_counter()
        win.Accumulate(buf, 0, (0, buf.size, MPI.FLOAT), MPI.SUM)
        win.Flush_all()
        t1 = time.perf_counter()
        win.Get(buf, 0, (0, buf.size, MPI.FLOAT))
        win.Flush_all()
        acc.append(t1 - t0)
        get.append(time.perf_counter() - t1)
    win.Unlock_all()
    return acc, get


def rank_main(args) -> None:
    """One rank of a row (under mpiexec): rank 0 serves, the active ranks time their ops."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), int(args.mb * (1 << 20)) // 4
    win = MPI.Win.Allocate(4 * n if rank == 0 else 0, 4, comm=comm)
    comm.Barrier()
    out = {}
    if rank == 0:
        out = serve(comm, n, args.poll)
    else:
        buf = np.ones(n, np.float32)
        if rank == 1:
            out["pingpong_s"] = pingpong(comm, buf)
        comm.Barrier()
        if rank <= args.active:
            acc, get = ops(win, buf, args.reps, args.compute)
            k = args.reps // 4
            out.update(acc_s=float(np.median(acc[k:])), get_s=float(np.median(get[k:])))
        request = comm.Ibarrier()
        while not request.Test():
            time.sleep(1e-4)
    rows = comm.gather(out, 0)
    win.Free()
    if rank == 0:
        Path(args.rows).write_text(json.dumps(rows))


def run_row(args, poll: float, tmp: Path) -> dict:
    out = tmp / f"{poll}.json"
    cmd = [PY, "-m", "psgd", "net", "--nodes", str(args.nodes), "--rate", args.rate, "--",
           common.mpiexec(), "-n", str(args.ranks), PY, str(Path(__file__).resolve()), "--rank",
           "--poll", str(poll), "--mb", str(args.mb), "--reps", str(args.reps), "--active",
           str(args.active), "--compute", str(args.compute), "--rows", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, timeout=300)
    if proc.returncode != 0:
        raise SystemExit(f"bench_rma: poll {poll} failed:\n{proc.stderr}")
    rows = json.loads(out.read_text())
    workers = [r for r in rows[1:] if "acc_s" in r]
    return {"poll_s": poll, "server_cpu": rows[0]["server_cpu"],
            "pingpong_s": rows[1]["pingpong_s"],
            "acc_s": float(np.mean([r["acc_s"] for r in workers])),
            "get_s": float(np.mean([r["get_s"] for r in workers]))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--active", type=int, default=1, help="ranks 1..ACTIVE do the ops")
    ap.add_argument("--polls", default="0,5e-5,1e-3", help="rank 0's sleeps between polls, s")
    ap.add_argument("--mb", type=float, default=7.62, help="window MB (the 2M MLP's 8 MB)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--compute", type=float, default=0.0, help="s of spinning before each pair")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--poll", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--rows", default=None, help=argparse.SUPPRESS)
    common.add_output_arguments(ap)
    args = ap.parse_args()
    if args.rank:
        rank_main(args)
        return
    if not 1 <= args.active < args.ranks:
        ap.error(f"--active must be between 1 and {args.ranks - 1}")
    out = common.out_dir(args, "rma")
    nbytes = 4 * (int(args.mb * (1 << 20)) // 4)
    lines = [f"{args.ranks} ranks on {args.nodes} nodes at {args.rate}, {args.active} active, "
             f"{nbytes / 1e6:.1f} MB, compute {args.compute * 1e3:.0f} ms before each pair", "",
             "| poll us | accumulate ms | MB/s | get ms | MB/s | send+recv MB/s | rank 0 CPU |",
             "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for poll in map(float, args.polls.split(",")):
            r = run_row(args, poll, Path(tmp))
            rows.append(r)
            acc, get = r["acc_s"], r["get_s"]
            lines.append(f"| {poll * 1e6:.0f} | {acc * 1e3:.2f} | {nbytes / acc / 1e6:.0f} | "
                         f"{get * 1e3:.2f} | {nbytes / get / 1e6:.0f} | "
                         f"{2 * nbytes / r['pingpong_s'] / 1e6:.0f} | {r['server_cpu']:.2f} |")
            print(lines[-1], flush=True)
    common.write_json(out / "rma.json", {"settings": vars(args), "rows": rows}, common.NO_DATA)
    common.write_text(out / "rma.md", "\n".join(lines), common.NO_DATA)
    print(f"wrote {out / 'rma.json'} and {out / 'rma.md'}")


if __name__ == "__main__":
    main()
