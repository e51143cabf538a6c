"""Hogwild throughput: updates/s for a ~1M-parameter vector, 2 workers, 1 server, no compute.

Run ``make bench-hogwild`` or ``python bench/bench_hogwild.py [--quick] [--json PATH]
[--windows shared,allocate,create]``; it launches itself under mpiexec (bench/common.py's)
once per window kind, writes hogwild.json into runs/bench/hogwild-TIME/ (``--publish``:
bench/results/; ``--json PATH``: there only) and prints updates/s, the push (accumulate) and pull
(get) time per update, and the server's CPU fraction (cpu_s / wall_s; the
point of hogwild is that this stays near zero).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def child(args) -> None:
    import numpy as np
    from mpi4py import MPI

    from psgd.errors import report_and_abort
    from psgd.hogwild.server import serve_hogwild
    from psgd.hogwild.worker import HogwildWorker
    from psgd.mpi import wait
    from psgd.mpi.roles import assign_roles
    from psgd.mpi.shardmap import ShardMap
    from psgd.protocols.features import make_config

    try:
        comm = MPI.COMM_WORLD
        roles = assign_roles(comm, args.servers)
        shard_map = ShardMap(args.n_params, args.servers)
        config = make_config("hogwild", args.n_params, optimizer="sgd")
        if roles.is_server:
            lo, hi = shard_map.range(roles.server_index)
            result = serve_hogwild(roles, shard_map, config,
                                   np.zeros(hi - lo, np.float32), window=args.window)
            server = np.array([result.cpu_s, result.wall_s])
        else:
            worker = HogwildWorker(roles, shard_map, config, window=args.window)
            params = np.zeros(args.n_params, np.float32)
            grad = np.full(args.n_params, 1e-3, np.float32)
            worker.start(params)
            for clock in range(args.warmup):
                worker.step(params, grad, clock, 0.01)
            wait.barrier(roles.worker_comm, "the other bench workers")
            t0 = time.perf_counter()
            base = dict(worker.stats)
            for clock in range(args.steps):
                worker.step(params, grad, clock, 0.01)
            elapsed = time.perf_counter() - t0
            worker.finish()
            mine = np.array([elapsed, worker.stats["push_s"] - base["push_s"],
                             worker.stats["pull_s"] - base["pull_s"]])
            server = None
        # summary: rank 0 (server) gathers worker timings
        if roles.rank == 0:
            rows = []
            for k in range(roles.n_workers):
                buf = np.empty(3)
                wait.wait(comm.Irecv(buf, roles.worker_rank(k), 7), "bench worker timings")
                rows.append(buf)
            rows = np.array(rows)
            total = args.steps * roles.n_workers
            out = {"window": result.window, "n_params": args.n_params,
                   "workers": roles.n_workers, "servers": roles.n_servers,
                   "updates": total,
                   "updates_per_s": total / rows[:, 0].max(),
                   "push_ms": 1e3 * rows[:, 1].sum() / total,
                   "pull_ms": 1e3 * rows[:, 2].sum() / total,
                   "server_cpu_s": float(server[0]), "server_wall_s": float(server[1]),
                   "server_cpu_fraction": float(server[0] / server[1]),
                   "max_staleness": result.max_staleness,
                   "mean_staleness": result.mean_staleness}
            print("RESULT " + json.dumps(out), flush=True)
        elif roles.is_worker:
            wait.wait(comm.Isend(mine, 0, 7), "rank 0 to take bench timings")
    except BaseException as exc:  # noqa: BLE001
        report_and_abort(exc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--json", metavar="PATH", help="write the results here (only)")
    common.add_output_arguments(parser)
    parser.add_argument("--windows", default="shared,allocate",
                        help="comma list of shared, allocate, create (create is ~100x slower)")
    parser.add_argument("--n-params", type=int, default=1 << 20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--window", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps is None:
        args.steps = 50 if args.quick else 400
    if args.child:
        child(args)
        return
    path = Path(args.json) if args.json else common.out_dir(args, "hogwild") / "hogwild.json"
    results = []
    for window in args.windows.split(","):
        cmd = [common.mpiexec(), "-n", str(args.servers + args.workers), sys.executable,
               os.path.abspath(__file__), "--child", "--window", window,
               "--n-params", str(args.n_params), "--servers", str(args.servers),
               "--steps", str(args.steps)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not line:
            sys.exit(f"bench_hogwild: {window} failed (exit {proc.returncode})\n"
                     f"{proc.stdout}\n{proc.stderr}")
        row = json.loads(line[0][len("RESULT "):])
        results.append(row)
        print(f"hogwild {window:9s} n={row['n_params']} W={row['workers']} S={row['servers']}: "
              f"{row['updates_per_s']:8.1f} updates/s  push {row['push_ms']:.3f} ms  "
              f"pull {row['pull_ms']:.3f} ms  server cpu {row['server_cpu_s']:.3f} s / "
              f"{row['server_wall_s']:.2f} s = {100 * row['server_cpu_fraction']:.1f}%  "
              f"staleness mean {row['mean_staleness']:.2f} max {row['max_staleness']}",
              flush=True)
    if len(results) > 1:
        base = results[0]
        for row in results[1:]:
            print(f"  {base['window']} / {row['window']}: "
                  f"{base['updates_per_s'] / row['updates_per_s']:.2f}x updates/s")
    common.write_json(path, {"bench": "hogwild", "results": results}, common.NO_DATA)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
