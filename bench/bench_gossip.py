"""`make bench-gossip`: decentralized training (gossip, adpsgd) against allreduce at equal samples.

    .venv/bin/python bench/bench_gossip.py [--quick] [--workers 4,8] [--seeds 0,1] ...
    .venv/bin/python bench/bench_gossip.py --net 1gbit --straggler 1,3 [--epochs 1] ...

Every cell is one ``mpiexec -n W python -m psgd train --servers 0`` on
Fashion-MNIST (synthetic data, with a warning, when it is not installed),
the same epochs, batch, optimizer and learning rate for every protocol. The
accuracy of gossip and adpsgd is the workers' mean model's (the lead's own
model beside it); bytes per worker per step are the model bytes each worker
sent (allreduce: what a ring all-reduce sends, 2 (W - 1) / W models, for
comparison; psgd's all-reduce goes through shared memory on one node).
Writes gossip.{json,md} (gossip-synthetic.* on synthetic data) into
runs/bench/gossip-TIME/ (--publish: bench/results/), adding to gossip.json run by run.

With ``--net RATE`` every run goes through ``psgd net --nodes W --rate RATE``
(a worker per emulated node, one shared link; root), once per factor of
``--straggler`` (the last worker that many times slower, 1: none), and the
table is of time to the target training accuracy: gossip-net.*.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
from common import ROOT, mpiexec, run_bounded  # noqa: E402
from training import dataset, error_line, on_nodes, time_to_target  # noqa: E402

RUNS = {"allreduce": ["--protocol", "allreduce"],
        "gossip ring": ["--protocol", "gossip", "--topology", "ring"],
        "gossip exponential": ["--protocol", "gossip", "--topology", "exponential"],
        "adpsgd ring": ["--protocol", "adpsgd", "--topology", "ring"]}


def train(name: str, workers: int, seed: int, data: Path, args, log: Path,
          straggler: float = 1.0) -> dict:
    """One run: final accuracy (mean and own model), throughput, bytes, time to target
    (on ``args.net``'s emulated nodes when it is set, the last worker ``straggler`` x slower)."""
    slow = [] if straggler == 1 else ["--straggler", f"{workers - 1}:slow={straggler:g}"]
    net = on_nodes(workers, args.net) if args.net else []
    cmd = [*net, mpiexec(), "-n", str(workers), sys.executable, "-m", "psgd",
           "train", "--data", str(data), "--model", args.model, *RUNS[name], "--servers", "0",
           "--optimizer", args.optimizer, "--lr", str(args.lr), "--momentum", str(args.momentum),
           "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--seed", str(seed),
           "--log-every", str(args.log_every), *slow, "--quiet", "--log", str(log)]
    t0 = time.perf_counter()
    proc = run_bounded(cmd, args.timeout, cwd=ROOT)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    summary = next((r for r in records if r["kind"] == "summary"), None)
    config = next((r for r in records if r["kind"] == "config"), {})
    row = {"run": name, "workers": workers, "seed": seed, "straggler": straggler,
           "wall_s": time.perf_counter() - t0, "ok": summary is not None}
    if summary is None:
        row["error"] = error_line(proc)
        return row
    model_bytes = 4 * config["n_params"]
    sent = summary.get("bytes_per_worker_step")
    row.update(accuracy=summary["test_accuracy"], own_accuracy=summary.get("own_test_accuracy"),
               consensus=summary.get("consensus_distance"), samples_per_s=summary["samples_per_s"],
               train_s=summary["wall_s"], model_bytes=model_bytes,
               bytes_per_worker_step=sent if sent is not None
               else 2 * (workers - 1) / workers * model_bytes,
               bytes_measured=sent is not None, steps=summary["steps"],
               time_to_target=time_to_target(records, args.target),
               accuracy_over_time=[(r["time"], r["train_accuracy"]) for r in records
                                   if r["kind"] == "step"],
               time_split=[{k: w[k] for k in ("wall_s", "compute_s", "straggle_s")}
                           for w in summary["workers"]])
    return row


def table(rows: list[dict], args) -> str:
    """Markdown: one line per W and run, over the seeds."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["workers"], list(RUNS).index(r["run"])), []).append(r)
    lines = ["| W | run | mean-model acc (per seed) | vs allreduce | worker 0's own acc | "
             "samples/s | s to train acc "
             f"{args.target:g} | models sent / worker / step |",
             "|---|---|---|---|---|---|---|---|"]
    for (w, index), runs in sorted(groups.items()):
        ok = [r for r in runs if r["ok"]]
        if not ok:
            lines.append(f"| {w} | {list(RUNS)[index]} | failed: {runs[0].get('error')} |"
                         " | | | | |")
            continue
        ref = [r["accuracy"] for r in rows if r["ok"] and r["workers"] == w
               and r["run"] == "allreduce"]
        accs = [r["accuracy"] for r in ok]
        delta = f"{100 * (statistics.mean(accs) - statistics.mean(ref)):+.2f} pt" if ref else "-"
        own = [r["own_accuracy"] for r in ok if r["own_accuracy"] is not None]
        times = [r["time_to_target"] for r in ok if r["time_to_target"] is not None]
        sent = statistics.mean(r["bytes_per_worker_step"] / r["model_bytes"] for r in ok)
        lines.append(
            f"| {w} | {ok[0]['run']} | {statistics.mean(accs):.4f} "
            f"({', '.join(f'{a:.4f}' for a in accs)}) | {delta} | "
            f"{f'{statistics.mean(own):.4f}' if own else '-'} | "
            f"{statistics.mean(r['samples_per_s'] for r in ok):.0f} | "
            f"{f'{statistics.mean(times):.1f}' if times else '-'} | "
            f"{sent:.2f}{'' if ok[0]['bytes_measured'] else ' (ring, computed)'} |")
    return "\n".join(lines)


def _spread(values: list[float], fmt: str = ".1f") -> str:
    """``mean (min-max)`` of ``values``, the mean alone for one."""
    mean = format(statistics.mean(values), fmt)
    return mean if len(values) == 1 else f"{mean} ({min(values):{fmt}}-{max(values):{fmt}})"


def net_table(rows: list[dict], args) -> str:
    """Markdown for --net: one line per straggler factor and run, over the seeds (mean and
    range), and the per-step time split of worker 0 and of the last worker."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["straggler"], list(RUNS).index(r["run"])), []).append(r)
    head = ["| last worker | run | s to train acc {:g} | vs allreduce | run's wall s | "
            "ms / step | final mean-model test acc | MB sent / worker / step |".format(args.target),
            "|---|---|---|---|---|---|---|---|"]
    split = ["| last worker | run | worker 0: compute, the rest (ms / step) | last worker: "
             "compute, straggle, the rest (ms / step) |", "|---|---|---|---|"]
    for (factor, index), runs in sorted(groups.items()):
        slow, name = "as the others" if factor == 1 else f"{factor:g}x slower", list(RUNS)[index]
        ok = [r for r in runs if r["ok"]]
        if not ok:
            head.append(f"| {slow} | {name} | failed: {runs[0]['error']} | | | | | |")
            continue
        base = [r["time_to_target"] for r in rows if r["ok"] and r["run"] == "allreduce"
                and r["straggler"] == factor and r["time_to_target"] is not None]
        times = [r["time_to_target"] for r in ok if r["time_to_target"] is not None]
        head.append(
            f"| {slow} | {name} | {_spread(times) if times else 'not reached'} | "
            f"{_versus(base, times)} | "
            f"{_spread([r['train_s'] for r in ok])} | "
            f"{_spread([1e3 * r['train_s'] / max(r['steps'], 1) for r in ok], '.0f')} | "
            f"{_spread([r['accuracy'] for r in ok], '.4f')} | "
            f"{ok[0]['bytes_per_worker_step'] / 1e6:.3f}"
            f"{'' if ok[0]['bytes_measured'] else ' (ring, computed)'} |")
        split.append(f"| {slow} | {name} | {_split(ok, 0, False)} | {_split(ok, -1, True)} |")
    return ("\n".join(head) + "\n\nWhere each worker's step goes (the rest: communication, "
            "waiting for the others, the optimizer):\n\n" + "\n".join(split))


def _split(runs: list[dict], worker: int, straggle: bool) -> str:
    """A worker's ms per step of compute, (straggle,) and the rest (communication, waits,
    the optimizer), over ``runs``."""
    def per(key):
        return statistics.mean(1e3 * r["time_split"][worker][key] / max(r["steps"], 1)
                               for r in runs)
    parts = [per("compute_s"), *([per("straggle_s")] if straggle else [])]
    return ", ".join(f"{v:.0f}" for v in [*parts, per("wall_s") - sum(parts)])


def _versus(base: list[float], times: list[float]) -> str:
    """How much sooner the mean of ``times`` is than the mean of ``base``."""
    if not base or not times:
        return "-"
    base, t = statistics.mean(base), statistics.mean(times)
    return f"{base / t:.2f}x sooner" if t <= base else f"{t / base:.2f}x later"


def net_plot(rows: list[dict], args, path: Path) -> None:
    """The lead's running training accuracy against wall time, a panel per straggler factor."""
    from psgd.figure import pyplot, save_figure
    factors = sorted({r["straggler"] for r in rows})
    fig, axes = pyplot().subplots(1, len(factors), figsize=(6 * len(factors), 4.5),
                                  squeeze=False, sharey=True)
    for ax, factor in zip(axes[0], factors):
        for k, name in enumerate(RUNS):
            runs = [r for r in rows if r["ok"] and r["straggler"] == factor and r["run"] == name]
            for i, r in enumerate(runs):
                ax.plot(*zip(*r["accuracy_over_time"]), color=f"C{k}", linewidth=1,
                        label=f"{name} ({len(runs)} seed{'s' * (len(runs) > 1)})" if i == 0
                        else None)
        ax.axhline(args.target, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"W = {rows[0]['workers']} nodes at {args.net}, last worker "
                     + ("as the others" if factor == 1 else f"{factor:g}x slower"), fontsize=10)
        ax.set_xlabel("wall time (s)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("worker 0's running training accuracy")
    fig.tight_layout()
    save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny run on synthetic data")
    common.add_output_arguments(ap)
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--workers", default="4")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--optimizer", default="momentum")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--net", metavar="RATE", default=None,
                    help="run on W emulated nodes behind one RATE link (psgd net; root)")
    ap.add_argument("--straggler", default="1", metavar="F[,F]",
                    help="with --net: the last worker F times slower, a set of runs per F "
                         "(1: none)")
    args = ap.parse_args(argv)
    if args.quick:
        args.workers, args.seeds, args.model = "2", "0", "mlp:784-32-10"
        args.epochs, args.target, args.log_every = 1, 0.2, 5
    runs = args.runs.split(",")
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        ap.error(f"--runs {', '.join(unknown)}: choose from {', '.join(RUNS)}")
    workers = [int(w) for w in args.workers.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    factors = [float(f) for f in args.straggler.split(",")]
    if not args.net and factors != [1]:
        ap.error("--straggler needs --net (the table of time to target under a slow link)")
    name = "gossip-net" if args.net else "gossip"
    out = common.out_dir(args, name)
    name = common.result_stem(name + ("-quick" if args.quick else ""), args.quick)
    rows = []
    with tempfile.TemporaryDirectory(prefix="psgd-gossip-") as tmp:
        data, data_name = dataset(Path(tmp), args.quick, "bench-gossip")
        if args.net:   # numba's kernels compiled into its cache before any run is timed
            warm = argparse.Namespace(**{**vars(args), "epochs": 0.02})
            train(runs[0], workers[0], seeds[0], data, warm, Path(tmp) / "warm.jsonl")
        todo = [(w, s, f, r) for w in workers for s in seeds for f in factors for r in runs]
        for i, (w, seed, factor, run) in enumerate(todo):
            row = train(run, w, seed, data, args, Path(tmp) / f"run{i}.jsonl", factor)
            rows.append(row)
            print(f"[{i + 1}/{len(todo)}] W={w} seed {seed} straggler {factor:g} {run}: "
                  f"{row.get('accuracy', row.get('error'))} ({row['wall_s']:.0f} s)", flush=True)
            common.write_json(out / f"{name}.json",
                              {"data": data_name, "settings": vars(args), "rows": rows}, data_name)
    setting = (f"{data_name}, {args.model}, {args.optimizer} lr {args.lr:g}, batch "
               f"{args.batch_size} per worker, {args.epochs:g} epochs")
    command = f"`python bench/bench_gossip.py {' '.join(argv or sys.argv[1:])}`"
    if args.net:
        net_plot(rows, args, out / f"{name}.png")
        common.stamp_png(out / f"{name}.png", data_name)
        text = (f"# Time to accuracy on {workers[0]} emulated nodes at {args.net}, with and "
                f"without a straggler ({setting})\n\n{workers[0]} ranks on {os.cpu_count()} "
                f"cores, one per `psgd net` node. {command}\n\n" + net_table(rows, args) + "\n")
    else:
        text = (f"# Decentralized training vs allreduce ({setting})\n\n"
                f"W ranks on {os.cpu_count()} cores (oversubscribed from W = "
                f"{os.cpu_count() + 1} on). {command}\n\n" + table(rows, args) + "\n")
    common.write_text(out / f"{name}.md", text, data_name)
    print(text)
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
