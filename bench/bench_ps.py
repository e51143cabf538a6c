"""Parameter-server push+pull throughput beside raw MPI point-to-point bandwidth, server CPU and memory.

Run ``make bench-ps`` (``ARGS=--publish``: into bench/results/) or
``.venv/bin/python bench/bench_ps.py [--quick] [--json PATH]``: it launches
itself under mpiexec once per case and writes ps.{json,md} into
runs/bench/ps-TIME/ (or only ``--json`` and ``--md`` where given).  Workers do no compute, so the numbers are
those of the PS path alone: each worker step pushes a ~1M-float32 gradient and
pulls the same bytes back.  Throughput counts push + pull bytes of all workers
per second; the raw figure is an Isend/Irecv ping-pong of the same size between
two ranks (bytes both ways per second).  The raw
ranks wait in MPI's own ``Waitall``, which MPICH busy-polls (lowest latency, a
whole core each); psgd's ranks wait through :mod:`psgd.mpi.wait`, which sleeps.

Pairing: the raw ping-pong runs before the first case and again after every
case, and each case's ratio is taken against the faster of the two raw runs
around it, so a case is compared with the machine as it was at that moment
(on the shared 2-core test VM the raw figure moved between 5 and 12 GB/s
within one minute).  The whole list of cases runs ``--repeat`` times (3 by
default, rounds one after the other); a case reports the run with the median
ratio, and the range of its ratios.

Memory: besides each rank's peak RSS (mostly Python, numba and MPI), a server
reports the bytes of the shard-length buffers it holds (``buffer_bytes``: the
bound of :mod:`psgd.ps.server`, (4 + k) shard lengths under asp/ssp and (5 + k)
under bsp for an optimizer with k state arrays, whatever the number of workers).
Rows marked ``+overlap`` run the workers with ``overlap=True`` (pull one clock
ahead); with no computation to hide it behind, they only show its cost.

Workers push from :attr:`psgd.ps.worker.PSWorker.grad_buffer`, where ``psgd
train`` computes the gradient, so the servers of the node read it in place
from the push window (:mod:`psgd.ps.push_window`); rows marked ``+messages`` turn
the window off and push by messages, as a worker does to a server on another
node. Rows marked ``+SPEC`` (``asp+qsgd:4``) compress every push with ``--compress
SPEC`` (error feedback as ``auto``), which psgd sends by messages: the encode, the
frame's send and the server's decode are in their time. The gradient is a normal
draw, so that compressors see values (top-k's threshold, qsgd's norms).
"""
import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402

TARGET = 0.5   # issue #4: push+pull throughput >= this fraction of the raw bandwidth


def child_raw(args):
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    buf = np.ones(args.n_params, np.float32)
    out = np.empty_like(buf)
    peer = 1 - rank

    def exchange():
        if rank == 0:
            MPI.Request.Waitall([comm.Isend(buf, peer, 1), comm.Irecv(out, peer, 2)])
        else:
            MPI.Request.Waitall([comm.Irecv(out, peer, 1)])
            MPI.Request.Waitall([comm.Isend(out, peer, 2)])

    for _ in range(3):
        exchange()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        exchange()
    dt = time.perf_counter() - t0
    rss = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, root=0)
    if rank == 0:
        mb = 2 * buf.nbytes * args.steps / dt / 1e6
        emit({"case": "raw", "MB_s": mb, "rtt_ms": dt / args.steps * 1e3, "maxrss_mb":
              [r / 1024 for r in rss]})


def child_ps(args):
    import numpy as np
    from mpi4py import MPI

    from psgd.mpi import wait
    from psgd.mpi.roles import assign_roles
    from psgd.mpi.shardmap import ShardMap
    from psgd.ps.server import serve
    from psgd.ps.worker import PSWorker
    comm = MPI.COMM_WORLD
    roles = assign_roles(comm, args.servers)
    config = _ps_config(args)
    smap = ShardMap(args.n_params, roles.n_servers)
    info = {}
    if roles.is_server:
        res = serve(roles, smap, config, init_shard=np.zeros(smap.size(roles.rank), np.float32))
        info = {"cpu_s": res.cpu_s, "wall_s": res.wall_s, "updates": res.n_updates,
                "window_pushes": res.n_window_pushes, "in_place_steps": res.n_in_place,
                "version_waits": res.n_version_waits,
                "buffer_mb": res.buffer_bytes / 1e6, "shard_mb": 4 * smap.size(roles.rank) / 1e6}
    else:
        worker = PSWorker(roles, smap, config)
        params = np.zeros(args.n_params, np.float32)
        worker.start(params)
        # the gradient a worker computes in the push window's buffer (as psgd train does)
        grad = worker.grad_buffer if worker.grad_buffer is not None else np.empty_like(params)
        grad[:] = np.random.default_rng(roles.rank).standard_normal(args.n_params) * 1e-3
        warm = 3
        for c in range(warm):
            worker.step(params, grad, c)
        wait.barrier(roles.worker_comm)
        t0 = time.perf_counter()
        for c in range(warm, warm + args.steps):
            worker.step(params, grad, c)
        info = {"time": time.perf_counter() - t0, **worker.stats}
        worker.finish()
    info["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    infos = comm.gather(info, root=0)
    if comm.Get_rank() == 0:
        workers = infos[roles.n_servers:]
        servers = infos[:roles.n_servers]
        dt = max(w["time"] for w in workers)
        nbytes = 2 * 4 * args.n_params * args.steps * len(workers)
        variant = ("+overlap" if args.overlap else "+messages" if args.messages else
                   "" if args.compress == "none" else f"+{args.compress}")
        emit({"case": f"{args.protocol}{variant} S={args.servers} W={len(workers)}",
              "MB_s": nbytes / dt / 1e6,
              "updates_s": args.steps * len(workers) / dt,
              "step_ms": 1e3 * dt / args.steps,
              "push_bytes": workers[0]["push_bytes"] / workers[0]["steps"],
              "server_cpu_fraction": [s["cpu_s"] / s["wall_s"] for s in servers],
              "server_window_pushes": [s["window_pushes"] for s in servers],
              "worker_wait_s": [round(w["wait_s"], 3) for w in workers],
              "server_buffers_mb": [s["buffer_mb"] for s in servers],
              "server_shard_mb": [s["shard_mb"] for s in servers],
              "maxrss_mb": [i["maxrss_mb"] for i in infos]})


def _ps_config(args):
    from psgd.protocols import get
    from psgd.protocols.features import CompressionOptions, make_config
    bound = 1 if get(args.protocol).bound is None else None   # ssp: s = 1
    coding = CompressionOptions(args.compress)   # error feedback auto
    return make_config(args.protocol, args.n_params, staleness=bound, overlap=args.overlap,
                       lr_schedule=lambda c: 1e-3, push_window=not args.messages,
                       compression=coding)


def emit(record):
    print("BENCH " + json.dumps(record), flush=True)


def launch(n, extra, timeout=300):
    cmd = [common.mpiexec(), "-n", str(n), sys.executable, str(Path(__file__).resolve()), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"bench case failed: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    return [json.loads(ln[6:]) for ln in proc.stdout.splitlines() if ln.startswith("BENCH ")][-1]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH", help="write the results here (only)")
    common.add_output_arguments(ap)
    ap.add_argument("--n-params", type=int, default=1 << 20)
    ap.add_argument("--child", choices=["raw", "ps"])
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--protocol", default="asp")
    ap.add_argument("--overlap", action="store_true", help="child: workers pull one clock ahead")
    ap.add_argument("--messages", action="store_true",
                    help="child: push by messages only (no push window), as across nodes")
    ap.add_argument("--compress", default="none", help="child: the pushes' compressor")
    ap.add_argument("--md", metavar="PATH", help="also write the cases' table (markdown)")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3,
                    help="rounds over all cases; each case reports its median (default 3; "
                         "--quick runs 1)")
    ap.add_argument("--server-counts", default="1,2", help="comma list of S to run (default 1,2)")
    ap.add_argument("--protocols", default="asp,ssp,bsp,asp+overlap,asp+messages,bsp+messages",
                    help="comma list; +overlap: workers pull ahead; +messages: no push window "
                         "(default asp,ssp,bsp,asp+overlap,asp+messages,bsp+messages)")
    return ap.parse_args()


def main():
    args = parse_args()
    if args.child == "raw":
        return child_raw(args)
    if args.child == "ps":
        return child_ps(args)
    out = None if args.json or args.md else common.out_dir(args, "ps")   # before any run
    cases = [(int(servers), case) for servers in args.server_counts.split(",")
             for case in args.protocols.split(",")]
    for _, case in cases:   # before anything runs
        variant = case.partition("+")[2]
        if variant not in ("", "overlap", "messages") and not _compressor(variant):
            raise SystemExit(f"unknown case {case!r}: PROTOCOL, PROTOCOL+overlap, "
                             f"PROTOCOL+messages or PROTOCOL+SPEC (a --compress other than none)")
    steps = 20 if args.quick else 300
    repeat = 1 if args.quick else args.repeat
    sizes = ["--n-params", str(args.n_params), "--steps", str(steps)]
    size_mb = 4 * args.n_params / 1e6
    print(f"psgd PS benchmark: {args.n_params} float32 ({size_mb:.1f} MB) per push and per pull, "
          f"{steps} steps, 2 workers, no compute; {repeat} round(s), each case paired with the "
          f"faster of the raw ping-pongs just before and after it")
    runs, raws = rounds(cases, sizes, repeat, size_mb)
    results = {"n_params": args.n_params, "steps": steps, "repeat": repeat,
               "raw_runs_MB_s": [r["MB_s"] for r in raws],
               "raw_rtt_ms": [r["rtt_ms"] for r in raws], "ps": []}
    print(f"raw MPI ping-pong: {min(results['raw_runs_MB_s']):.0f}-"
          f"{max(results['raw_runs_MB_s']):.0f} MB/s over {len(raws)} runs; per case, the run "
          f"with the median ratio (target {TARGET}):")
    for case in cases:
        results["ps"].append(report(runs[case]))
    text = markdown(results, runs, " ".join(sys.argv[1:]))
    if out is None:
        if args.json:
            common.write_json(Path(args.json), results, common.NO_DATA)
        if args.md:
            common.write_text(Path(args.md), text, common.NO_DATA)
        return
    common.write_json(out / "ps.json", results, common.NO_DATA)
    common.write_text(out / "ps.md", text, common.NO_DATA)
    print(f"wrote {out / 'ps.json'} and {out / 'ps.md'}")
    if args.publish:
        print(f"wrote {docs_page(results, text, out)}")


def docs_page(results: dict, text: str, out: Path) -> Path:
    """docs/results/ps.md from the published ps.json and ps.md."""
    raw = results["raw_runs_MB_s"]
    about = (f"Push + pull throughput of the parameter server (no compute: the PS path alone), "
             f"each case beside a raw MPI ping-pong of the same bytes run just before and "
             f"after it (raw: {min(raw):.0f}-{max(raw):.0f} MB/s over {len(raw)} runs). "
             f"`ratio` is the case's MB/s over the faster raw run around it; the target is "
             f"{TARGET}. Rows and columns as in `bench/bench_ps.py`'s docstring.")
    ratios = ["| case | MB/s | ratio to raw (median) | runs | server CPU / wall |",
              "|---|---|---|---|---|"]
    for r in results["ps"]:
        ratios.append(f"| {r['case']} | {r['MB_s']:.0f} | {r['ratio_to_raw']:.3f} | "
                      f"{', '.join(f'{x:.2f}' for x in r['ratio_runs'])} | "
                      f"{', '.join(f'{f:.2f}' for f in r['server_cpu_fraction'])} |")
    body = "\n".join(ratios) + "\n\n" + "\n".join(text.splitlines()[2:])
    return common.docs_page("ps", "Parameter server: push + pull throughput", about, body,
                            [out / "ps.json", out / "ps.md"])


def rounds(cases: list, sizes: list, repeat: int, size_mb: float) -> tuple[dict, list]:
    """Every case ``repeat`` times, interleaved, each run between two raw ping-pongs."""
    raws = [launch(2, ["--child", "raw", *sizes])]
    print(f"raw MPI ping-pong ({size_mb:.1f} MB each way): {raws[0]['MB_s']:.0f} MB/s, "
          f"rtt {raws[0]['rtt_ms']:.2f} ms")
    runs: dict[tuple, list] = {case: [] for case in cases}
    for rnd in range(repeat):
        for servers, case in cases:
            protocol, _, variant = case.partition("+")
            flag = (["--compress", variant] if _compressor(variant) else
                    [f"--{variant}"] if variant else [])
            r = launch(servers + 2, ["--child", "ps", "--servers", str(servers),
                                     "--protocol", protocol, *sizes, *flag])
            raws.append(launch(2, ["--child", "raw", *sizes]))
            r["raw_MB_s"] = max(raws[-2]["MB_s"], raws[-1]["MB_s"])
            r["ratio_to_raw"] = r["MB_s"] / r["raw_MB_s"]
            runs[(servers, case)].append(r)
            print(f"  round {rnd + 1}: {r['case']:<22} {r['MB_s']:6.0f} MB/s, raw around it "
                  f"{raws[-2]['MB_s']:.0f} / {raws[-1]['MB_s']:.0f} MB/s: "
                  f"{r['ratio_to_raw']:.3f} of raw", flush=True)
    return runs, raws


def report(runs: list) -> dict:
    """A case's run with the median ratio to raw, printed with its spread."""
    ratios = sorted(r["ratio_to_raw"] for r in runs)
    r = sorted(runs, key=lambda r: r["ratio_to_raw"])[(len(ratios) - 1) // 2]
    r["ratio_runs"] = ratios
    r["MB_s_runs"] = [x["MB_s"] for x in runs]
    cpu = ", ".join(f"{f:.2f}" for f in r["server_cpu_fraction"])
    rss = ", ".join(f"{m:.0f}" for m in r["maxrss_mb"])
    bufs = ", ".join(f"{b:.1f}" for b in r["server_buffers_mb"])
    shards = ", ".join(f"{b / m:.0f}" for b, m in zip(r["server_buffers_mb"],
                                                       r["server_shard_mb"]))
    mark = "ok" if r["ratio_to_raw"] >= TARGET else "MISS"
    spread = f" (runs {ratios[0]:.2f}-{ratios[-1]:.2f})" if len(ratios) > 1 else ""
    print(f"{r['case']:<22} {r['MB_s']:8.0f} MB/s  {r['updates_s']:7.1f} updates/s  "
          f"{r['ratio_to_raw']:.3f} of raw {r['raw_MB_s']:.0f}{spread} {mark}  "
          f"server cpu/wall [{cpu}]  server buffers MB [{bufs}] (= [{shards}] shards)  "
          f"maxrss MB by rank [{rss}]")
    return r


def _compressor(variant: str) -> bool:
    """Whether a case's variant names a compressor (``qsgd:4``), not overlap or messages."""
    if variant in ("", "overlap", "messages"):
        return False
    from psgd.compress import make
    try:
        return make(variant) is not None
    except ValueError:
        return False


def markdown(results: dict, runs: dict, argv: str) -> str:
    """The cases side by side: ms per step (push + pull) and bytes pushed, median and range."""
    lines = [f"`.venv/bin/python bench/bench_ps.py {argv}`", "",
             f"{results['n_params']} float32 per push and pull, {results['steps']} steps per "
             f"run, no compute, {results['repeat']} runs per case (rounds interleaved). Bytes "
             f"pushed are the worker's count (headers and payload; through the push window the "
             f"payload is read in place, not sent).", "",
             "| case | ms per step (median) | runs (ms) | bytes pushed per step | updates/s "
             "(median) |", "|---|---|---|---|---|"]
    for (servers, case), rs in runs.items():
        ms = sorted(r["step_ms"] for r in rs)
        lines.append(f"| {rs[0]['case']} | {ms[(len(ms) - 1) // 2]:.2f} | "
                     f"{', '.join(f'{m:.2f}' for m in ms)} | {rs[0]['push_bytes']:.0f} | "
                     f"{sorted(r['updates_s'] for r in rs)[(len(rs) - 1) // 2]:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
