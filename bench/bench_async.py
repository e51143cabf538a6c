"""`make bench-async`: staleness compensation under bsp, ssp and asp (and hogwild), as final accuracy at equal samples.

    .venv/bin/python bench/bench_async.py [--quick] [--workers 2,4,8] [--seeds 0,1,2] [--add] ...

Every cell is one ``mpiexec -n W+1 python -m psgd train`` (one server) on
Fashion-MNIST (Debian's dataset-fashion-mnist; synthetic data, with a
warning, when it is not installed), the same epochs, batch, optimizer and
learning rate for every protocol and method, so every run sees the same
samples.  bsp runs once per W and seed (it has nothing to compensate).
The final accuracy is on the whole test split; curves and the time to a
target use the lead worker's running training accuracy, which costs nothing
(evaluating mid-run on the lead makes it a straggler: under asp its pushes
grew 35 clocks stale on average, and that alone cost 2-3 points).
Writes async.{json,md} and async.png (training accuracy against samples, per
method; ``async-synthetic.*`` on synthetic data) into runs/bench/async-TIME/
(``--publish``: bench/results/, ``--out DIR``), adding to async.json run by
run so a stopped benchmark keeps what it measured.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
from training import dataset, error_line, mean_staleness, train as run_train  # noqa: E402

METHODS = ("none", "inverse", "dcasgd", "gap", "amom", "dana", "dana-adam", "auto")
PROTOCOLS = {"bsp": [], "ssp": ["--staleness", "2"], "asp": [], "hogwild": []}
MODELS = {"lenet": "lenet", "mlp": "mlp:784-256-256-10"}


def cells(args) -> list[dict]:
    """Every run of the benchmark, bsp once per model, W and seed."""
    out = []
    for model in args.models:
        for w in args.workers:
            for seed in args.seeds:
                for protocol in args.protocols:
                    for method in (("none",) if protocol == "bsp" else args.methods):
                        out.append({"model": model, "workers": w, "seed": seed,
                                    "protocol": protocol, "method": method})
    return out


def train(cell: dict, data: Path, args, log: Path) -> dict:
    """One run; its final accuracy, throughput, staleness and accuracy curve."""
    flags = ["--data", data, "--model", MODELS[cell["model"]], "--protocol", cell["protocol"],
             *PROTOCOLS[cell["protocol"]], "--optimizer", args.optimizer, "--lr", args.lr,
             "--lr-schedule", args.lr_schedule,
             "--momentum", args.momentum, "--batch-size", args.batch_size,
             "--epochs", args.epochs, "--seed", cell["seed"], "--eval-every", args.eval_every,
             "--eval-samples", args.eval_samples]
    if cell["protocol"] != "bsp":
        flags += ["--staleness-comp", cell["method"]]
    proc, records, wall = run_train(cell["workers"], flags, log, args.timeout)
    summary = next((r for r in records if r["kind"] == "summary"), None)
    config = next((r for r in records if r["kind"] == "config"), {})
    row = {**cell, "wall_s": wall, "ok": summary is not None}
    if summary is None:
        row["error"] = error_line(proc)
        return row
    hist = summary["staleness_histogram"] or [0]
    per_step = args.batch_size * cell["workers"]
    steps = [r for r in records if r["kind"] == "step"]
    curve = [(r["step"] * per_step, r["train_accuracy"]) for r in steps]
    row.update(accuracy=summary["test_accuracy"], samples_per_s=summary["samples_per_s"],
               mean_staleness=mean_staleness(hist),
               max_staleness=len(hist) - 1, curve=curve,
               compensation=(summary.get("staleness_compensation") or [None])[0],
               comp_asked=config.get("staleness_comp"),
               time_to_target=next((r["time"] for r in steps
                                    if r["train_accuracy"] >= args.target), None))
    return row


def table(rows: list[dict], args) -> str:
    """Markdown: one line per model, W, protocol and method, over the seeds."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["model"], r["workers"], r["protocol"], r["method"]), []).append(r)
    bsp = {(r["model"], r["workers"], r["seed"]): r.get("accuracy", 0.0) for r in rows
           if r["protocol"] == "bsp"}
    lines = [f"| model | W | protocol | method | mean acc | worst seed | vs bsp, same seed: "
             f"mean / worst | s to train acc {args.target:g} | mean / max staleness | seeds |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (model, w, protocol, method), runs in sorted(groups.items()):
        accs = [r.get("accuracy", 0.0) if r["ok"] else 0.0 for r in runs]
        gaps = [100 * (a - bsp[model, w, r["seed"]]) for a, r in zip(accs, runs)
                if (model, w, r["seed"]) in bsp]
        delta = f"{statistics.mean(gaps):+.1f} / {min(gaps):+.1f} pt" if gaps else "-"
        times = [r["time_to_target"] for r in runs if r.get("time_to_target") is not None]
        reach = f"{statistics.mean(times):.1f} ({len(times)}/{len(runs)})" if times else "-"
        stale = [r for r in runs if r["ok"]]
        st = (f"{statistics.mean(r['mean_staleness'] for r in stale):.2f} / "
              f"{max(r['max_staleness'] for r in stale)}") if stale else "-"
        failed = sum(not r["ok"] for r in runs)
        lines.append(f"| {model} | {w} | {protocol} | {method} | {statistics.mean(accs):.4f} | "
                     f"{min(accs):.4f} | {delta} | {reach} | {st} | {len(runs)}"
                     f"{f' ({failed} diverged)' if failed else ''} |")
    return "\n".join(lines)


SAME = ("optimizer", "lr", "lr_schedule", "momentum", "batch_size", "epochs", "eval_every",
        "eval_samples")
BEFORE = {"lr_schedule": "constant"}   # a setting a grid run before it existed ran with


def previous_rows(path: Path, todo: list[dict], args) -> list[dict]:
    """The rows of an earlier run of the grid at ``path``, less the cells about to run again."""
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    settings = earlier["settings"]
    differ = [f"{k} {settings.get(k, BEFORE.get(k))}" for k in SAME
              if settings.get(k, BEFORE.get(k)) != getattr(args, k)]
    if differ:
        raise SystemExit(f"bench_async: --add: {path} was run with other settings "
                         f"({', '.join(differ)})")
    again = {tuple(cell.values()) for cell in todo}
    return [r for r in earlier["rows"]
            if (r["model"], r["workers"], r["seed"], r["protocol"], r["method"]) not in again]


def plot(rows: list[dict], path: Path) -> None:
    """Training accuracy against samples, one panel per W (asp, first model, first seed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ws = sorted({r["workers"] for r in rows})
    fig, axes = plt.subplots(1, len(ws), figsize=(5 * len(ws), 4), squeeze=False)
    model = rows[0]["model"]
    for ax, w in zip(axes[0], ws):
        for r in rows:
            if r["workers"] == w and r["seed"] == rows[0]["seed"] and r["model"] == model \
                    and r.get("curve") and r["protocol"] in ("asp", "bsp"):
                x, y = zip(*r["curve"])
                ax.plot(x, y, label=f"{r['protocol']} {r['method']}" if r["protocol"] != "bsp"
                        else "bsp", lw=2.5 if r["protocol"] == "bsp" else 1.2)
        ax.set(title=f"{model}, W={w}, asp", xlabel="samples", ylabel="training accuracy",
               ylim=(0, 1))
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny subset on synthetic data")
    common.add_output_arguments(ap)
    ap.add_argument("--protocols", default="bsp,ssp,asp")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--workers", default="2,4,8")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--models", default="lenet,mlp")
    ap.add_argument("--optimizer", default="momentum")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--lr-schedule", default="constant", help="psgd train's --lr-schedule")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=2.0)
    ap.add_argument("--eval-every", type=int, default=0, help="mid-run evaluations (0: none)")
    ap.add_argument("--eval-samples", type=int, default=0, help="test samples per evaluation "
                                                                 "(0: all)")
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--add", action="store_true",
                    help="add these runs to the grid already in OUT's JSON (a run of the same "
                         "cell replaces the old one) and rewrite its table and plot")
    args = ap.parse_args(argv)
    if args.quick:
        args.workers, args.seeds, args.models = "2", "0", "mlp"
        args.methods, args.protocols, args.epochs, args.target = "none,amom", "bsp,asp", 1, 0.2
    for key in ("protocols", "methods", "models"):
        setattr(args, key, getattr(args, key).split(","))
    args.workers = [int(w) for w in args.workers.split(",")]
    args.seeds = [int(s) for s in args.seeds.split(",")]
    if args.add and not (args.out or args.publish):
        ap.error("--add adds to the grid in --out DIR (or --publish's bench/results/)")
    out = common.out_dir(args, "async")
    name = common.result_stem("async-quick" if args.quick else "async", args.quick)
    kept = previous_rows(out / f"{name}.json", cells(args), args) if args.add else []
    rows = []
    with tempfile.TemporaryDirectory(prefix="psgd-async-") as tmp:
        data, data_name = dataset(Path(tmp), args.quick, "bench-async")
        todo = cells(args)
        for i, cell in enumerate(todo):
            row = train(cell, data, args, Path(tmp) / f"run{i}.jsonl")
            rows.append(row)
            print(f"[{i + 1}/{len(todo)}] {cell['model']} W={cell['workers']} seed "
                  f"{cell['seed']} {cell['protocol']} {cell['method']}: "
                  f"{row.get('accuracy', row.get('error'))} ({row['wall_s']:.0f} s)", flush=True)
            common.write_json(out / f"{name}.json", {
                "data": data_name, "settings": {k: v for k, v in vars(args).items()},
                "rows": kept + rows}, data_name)
    rows = kept + rows
    schedule = "" if args.lr_schedule == "constant" else f" ({args.lr_schedule})"
    text = (f"# Staleness compensation ({data_name}, {args.optimizer} lr {args.lr:g}{schedule}"
            f"{f' momentum {args.momentum:g}' if args.optimizer in ('momentum', 'nesterov') else ''}, batch "
            f"{args.batch_size} per worker, {args.epochs:g} epochs, 1 server)\n\n"
            f"Each run is W + 1 ranks (one server) on {os.cpu_count()} cores: from W = "
            f"{os.cpu_count()} on, the ranks are oversubscribed.\n\n" + table(rows, args) + "\n")
    common.write_text(out / f"{name}.md", text, data_name)
    plot(rows, out / f"{name}.png")
    common.stamp_png(out / f"{name}.png", data_name)
    print(text)
    return 0 if rows and all(r["ok"] or r["method"] == "none" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
