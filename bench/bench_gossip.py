"""`make bench-gossip`: decentralized training (gossip, adpsgd) against allreduce at equal samples.

    .venv/bin/python bench/bench_gossip.py [--quick] [--workers 4,8] [--seeds 0,1] ...

Every cell is one ``mpiexec -n W python -m psgd train --servers 0`` on
Fashion-MNIST (synthetic data, with a warning, when it is not installed),
the same epochs, batch, optimizer and learning rate for every protocol. The
accuracy of gossip and adpsgd is the workers' mean model's (the lead's own
model beside it); bytes per worker per step are the model bytes each worker
sent (allreduce: what a ring all-reduce sends, 2 (W - 1) / W models, for
comparison; psgd's all-reduce goes through shared memory on one node).
Writes bench/results/gossip.{json,md}, adding to gossip.json run by run.
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
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from training import dataset  # noqa: E402
from protocols import run_bounded  # noqa: E402

RUNS = {"allreduce": ["--protocol", "allreduce"],
        "gossip ring": ["--protocol", "gossip", "--topology", "ring"],
        "gossip exponential": ["--protocol", "gossip", "--topology", "exponential"],
        "adpsgd ring": ["--protocol", "adpsgd", "--topology", "ring"]}


def train(name: str, workers: int, seed: int, data: Path, args, log: Path) -> dict:
    """One run: final accuracy (mean and own model), throughput, bytes, time to target."""
    cmd = [str(ROOT / ".venv/bin/mpiexec"), "-n", str(workers), sys.executable, "-m", "psgd",
           "train", "--data", str(data), "--model", args.model, *RUNS[name], "--servers", "0",
           "--optimizer", args.optimizer, "--lr", str(args.lr), "--momentum", str(args.momentum),
           "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--seed", str(seed),
           "--log-every", str(args.log_every), "--quiet", "--log", str(log)]
    t0 = time.perf_counter()
    proc = run_bounded(cmd, args.timeout, cwd=ROOT)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    summary = next((r for r in records if r["kind"] == "summary"), None)
    config = next((r for r in records if r["kind"] == "config"), {})
    row = {"run": name, "workers": workers, "seed": seed, "wall_s": time.perf_counter() - t0,
           "ok": summary is not None}
    if summary is None:
        row["error"] = (proc.stderr.strip().splitlines() or ["no summary"])[-1][:200]
        return row
    steps = [r for r in records if r["kind"] == "step"]
    model_bytes = 4 * config["n_params"]
    sent = summary.get("bytes_per_worker_step")
    row.update(accuracy=summary["test_accuracy"], own_accuracy=summary.get("own_test_accuracy"),
               consensus=summary.get("consensus_distance"), samples_per_s=summary["samples_per_s"],
               train_s=summary["wall_s"], model_bytes=model_bytes,
               bytes_per_worker_step=sent if sent is not None
               else 2 * (workers - 1) / workers * model_bytes,
               bytes_measured=sent is not None,
               time_to_target=next((r["time"] for r in steps
                                    if r["train_accuracy"] >= args.target), None))
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny run on synthetic data")
    ap.add_argument("--out", default=str(BENCH / "results"))
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
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "gossip-quick" if args.quick else "gossip"
    rows = []
    with tempfile.TemporaryDirectory(prefix="psgd-gossip-") as tmp:
        data, data_name = dataset(Path(tmp), args.quick, "bench-gossip")
        todo = [(w, s, r) for w in workers for s in seeds for r in runs]
        for i, (w, seed, run) in enumerate(todo):
            row = train(run, w, seed, data, args, Path(tmp) / f"run{i}.jsonl")
            rows.append(row)
            print(f"[{i + 1}/{len(todo)}] W={w} seed {seed} {run}: "
                  f"{row.get('accuracy', row.get('error'))} ({row['wall_s']:.0f} s)", flush=True)
            (out / f"{name}.json").write_text(json.dumps(
                {"data": data_name, "settings": vars(args), "rows": rows}, indent=1))
    text = (f"# Decentralized training vs allreduce ({data_name}, {args.model}, {args.optimizer} "
            f"lr {args.lr:g}, batch {args.batch_size} per worker, {args.epochs:g} epochs)\n\n"
            f"W ranks on {os.cpu_count()} cores (oversubscribed from W = {os.cpu_count() + 1} "
            f"on). `python bench/bench_gossip.py {' '.join(argv or sys.argv[1:])}`\n\n"
            + table(rows, args) + "\n")
    (out / f"{name}.md").write_text(text)
    print(text)
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
