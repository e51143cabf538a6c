"""`make bench-stragglers`: where bounded staleness pays, as time to a target test accuracy under emulated stragglers.

    .venv/bin/python bench/bench_stragglers.py [--quick] [--workers 2,4] [--seeds 0,1,2] ...

Every cell is one ``mpiexec -n W+1 python -m psgd train`` (one server), LeNet
on Fashion-MNIST (Debian's dataset-fashion-mnist; synthetic data, with a
warning, when it is not installed), in one of three scenarios: no straggler,
the last worker 3x slower (``--straggler W-1:slow=3``), and transient pauses
(``--straggler all:p=0.1,d=5x``: each step, with probability 0.1, a pause of
five times the worker's mean compute time), under bsp, ssp s = 1, 3, 8, asp
and ssp with ``--staleness auto``, with the same samples per worker-set.
The test accuracy over time comes from the servers' snapshots
(``--checkpoint-every``), kept as they appear and evaluated after the run, so
no worker evaluates mid-run (which would make it a straggler).  Writes
stragglers.{json,md,png} (stragglers-synthetic.* on synthetic data) into
runs/bench/stragglers-TIME/ (--publish: bench/results/), adding to the json run by run.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
from training import (dataset, error_line, grid_options, mean_staleness,  # noqa: E402
                      train as run_train)

SCENARIOS = {"none": None, "slow": "{last}:slow=3", "transient": "all:p=0.1,d=5x"}
PROTOCOLS = {"bsp": ["--protocol", "bsp"], "ssp s=1": ["--protocol", "ssp", "--staleness", "1"],
             "ssp s=3": ["--protocol", "ssp", "--staleness", "3"],
             "ssp s=8": ["--protocol", "ssp", "--staleness", "8"], "asp": ["--protocol", "asp"],
             "ssp auto": ["--protocol", "ssp", "--staleness", "auto"]}
FIXED = ("ssp s=1", "ssp s=3", "ssp s=8")


class SnapshotKeeper(threading.Thread):
    """Hard-links each checkpoint the run writes (the run keeps only its newest three) and
    notes when it appeared, from when the run's log appeared."""

    def __init__(self, ckpt_dir: Path, keep_dir: Path, log: Path) -> None:
        super().__init__(daemon=True)
        self.ckpt_dir, self.keep_dir, self.log = ckpt_dir, keep_dir, log
        self.start_time: float | None = None
        self.kept: dict[str, float] = {}      # name -> wall time (s) after the log appeared
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.poll()
            time.sleep(0.02)
        self.poll()

    def poll(self) -> None:
        if self.start_time is None and self.log.exists():
            self.start_time = time.time()
        for path in self.ckpt_dir.glob("ckpt-*.h5") if self.ckpt_dir.exists() else ():
            if path.name in self.kept:
                continue
            try:
                mtime = path.stat().st_mtime
                os.link(path, self.keep_dir / path.name)
            except FileNotFoundError:   # rotated away between the listing and the link
                continue
            self.kept[path.name] = mtime - (self.start_time or mtime)


def evaluate(keeper: SnapshotKeeper, model_spec: str, test) -> list[tuple[float, int, float]]:
    """``(seconds, step, test accuracy)`` of every kept snapshot, in time order."""
    from psgd.nn.model import build_model
    from psgd.run.checkpoint import load_checkpoint
    model = build_model(model_spec)
    out = []
    for name, t in sorted(keeper.kept.items(), key=lambda kv: kv[1]):
        ckpt = load_checkpoint(keeper.keep_dir / name)
        model.params[:] = ckpt.params
        out.append((round(t, 3), ckpt.step, model.evaluate(*test)[1]))
    return out


def train(cell: dict, data: Path, args, tmp: Path, test) -> dict:
    """One run: its curve of test accuracy over time, final accuracy, staleness, bound."""
    run_dir = tmp / f"run{cell['index']}"
    (run_dir / "keep").mkdir(parents=True)
    log = run_dir / "log.jsonl"
    spec = SCENARIOS[cell["scenario"]]
    flags = ["--data", data, "--model", args.model, *PROTOCOLS[cell["protocol"]],
             "--optimizer", "momentum", "--lr", args.lr, "--momentum", 0.9,
             "--batch-size", args.batch_size, "--steps", args.samples // cell["workers"],
             "--seed", cell["seed"], "--log-every", 5,
             "--checkpoint-dir", run_dir / "ckpt", "--checkpoint-every", args.every]
    if cell["protocol"] != "bsp":      # bsp has no staleness to compensate
        flags += ["--staleness-comp", args.staleness_comp]
    if spec:
        flags += ["--straggler", spec.format(last=cell["workers"] - 1)]
    keeper = SnapshotKeeper(run_dir / "ckpt", run_dir / "keep", log)
    keeper.start()
    try:
        proc, records, wall = run_train(cell["workers"], flags, log, args.timeout)
    finally:
        keeper.stop.set()
        keeper.join()
    summary = next((r for r in records if r["kind"] == "summary"), None)
    row = {**cell, "wall_s": wall, "ok": summary is not None}
    if summary is None:
        row["error"] = error_line(proc)
        return row
    curve = evaluate(keeper, args.model, test)
    hist = summary["staleness_histogram"] or [0]
    row.update(accuracy=summary["test_accuracy"], run_s=summary["wall_s"],
               samples_per_s=summary["samples_per_s"], curve=curve,
               mean_staleness=mean_staleness(hist), max_staleness=len(hist) - 1,
               wait_s=summary["worker_time"]["wait_s"],
               # a step's real compute: the unit of the emulated stragglers and of the load
               compute_step_s=summary["worker_time"]["compute_s"] / max(summary["steps"], 1),
               time_to_target=next((t for t, _, acc in curve if acc >= args.target), None),
               step_to_target=next((c for _, c, acc in curve if acc >= args.target), None),
               bound=[(r["time"], r["staleness_bound"]) for r in records
                      if r["kind"] == "step" and "staleness_bound" in r])
    return row


def _mean_time(runs: list[dict], normalized: bool = False) -> float | None:
    """Mean time to target over the seeds (``normalized``: in units of the run's mean compute
    time of a step, which the load of the machine and the stragglers scale alike); None
    unless every seed reached it."""
    times = [r.get("time_to_target") for r in runs]
    if not times or None in times:
        return None
    if normalized:
        times = [t / r["compute_step_s"] for t, r in zip(times, runs)]
    return statistics.mean(times)


def table(rows: list[dict], args) -> str:
    """Markdown: one line per scenario, W and protocol, over the seeds; then the verdicts."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["workers"]), {}).setdefault(r["protocol"], []).append(r)
    lines = [f"| scenario | W | protocol | s to test acc {args.target:g} (mean; range) | "
             f"vs best fixed s | in compute steps (vs best fixed s) | clocks to it | samples/s | "
             f"final acc (mean) | mean / max staleness | worker wait s | seeds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    verdicts, within = [], {p: 0 for p in FIXED + ("ssp auto",)}
    within_norm = dict(within)
    order = list(SCENARIOS)
    for (scenario, w), by_proto in sorted(groups.items(), key=lambda kv: (order.index(kv[0][0]),
                                                                          kv[0][1])):
        means = {p: _mean_time(runs) for p, runs in by_proto.items()}
        fixed = {p: t for p, t in means.items() if p in FIXED and t is not None}
        best = min(fixed.values()) if fixed else None
        norms = {p: _mean_time(runs, normalized=True) for p, runs in by_proto.items()}
        fixed_norm = {p: t for p, t in norms.items() if p in FIXED and t is not None}
        best_norm = min(fixed_norm.values()) if fixed_norm else None
        for p in PROTOCOLS:
            runs = by_proto.get(p)
            if not runs:
                continue
            ok = [r for r in runs if r["ok"]]
            times = [r["time_to_target"] for r in ok if r.get("time_to_target") is not None]
            reach = (f"{means[p]:.1f}; {min(times):.1f}-{max(times):.1f}" if means[p] is not None
                     else f"- ({len(times)}/{len(runs)} reached)")
            rel = f"{means[p] / best:.2f}x" if best and means[p] is not None else "-"
            if best and means[p] is not None and means[p] <= 1.1 * best and p in within:
                within[p] += 1
            acc = statistics.mean(r["accuracy"] for r in ok) if ok else float("nan")
            st = (f"{statistics.mean(r['mean_staleness'] for r in ok):.2f} / "
                  f"{max(r['max_staleness'] for r in ok)}") if ok else "-"
            wait = f"{statistics.mean(r['wait_s'] for r in ok):.1f}" if ok else "-"
            norm = (f"{norms[p]:.0f} ({norms[p] / best_norm:.2f}x)"
                    if norms.get(p) is not None and best_norm else "-")
            if best_norm and norms.get(p) is not None and norms[p] <= 1.1 * best_norm \
                    and p in within_norm:
                within_norm[p] += 1
            clocks = [r["step_to_target"] for r in ok if r.get("step_to_target") is not None]
            clocks = f"{statistics.mean(clocks):.0f}" if clocks else "-"
            rate = f"{statistics.mean(r['samples_per_s'] for r in ok):.0f}" if ok else "-"
            lines.append(f"| {scenario} | {w} | {p} | {reach} | {rel} | {norm} | {clocks} | {rate} | "
                         f"{acc:.4f} | {st} | "
                         f"{wait} | {len(runs)}{f' ({len(runs) - len(ok)} failed)' if len(ok) < len(runs) else ''} |")
        if best_norm is not None:
            best_q = min(fixed_norm, key=fixed_norm.get)
            verdicts.append(
                f"- {scenario}, W={w}, in compute steps: best fixed s {best_q} "
                f"({best_norm:.0f}); bsp {_fmt(norms.get('bsp'), '', 'bsp' in by_proto)}, asp "
                f"{_fmt(norms.get('asp'), '', 'asp' in by_proto)}: ssp "
                f"{_beats(best_norm, norms, by_proto)}"
                f"; auto {_fmt(norms.get('ssp auto'), '')} ({_ratio(norms.get('ssp auto'), best_norm)})")
        if best is not None:
            best_p = min(fixed, key=fixed.get)
            verdicts.append(
                f"- {scenario}, W={w}: best fixed s is {best_p} ({best:.1f} s); "
                f"bsp {_fmt(means.get('bsp'), ran='bsp' in by_proto)}, asp "
                f"{_fmt(means.get('asp'), ran='asp' in by_proto)}: ssp "
                f"{_beats(best, means, by_proto)}; auto "
                f"{_fmt(means.get('ssp auto'))} ({_ratio(means.get('ssp auto'), best)} of the best "
                f"fixed s)")
    n = len(groups)
    verdicts.append(f"- within 10 % of the best fixed s, out of {n} scenario x W cells: "
                    + ", ".join(f"{p} {k}" for p, k in within.items())
                    + "; in compute steps: "
                    + ", ".join(f"{p} {k}" for p, k in within_norm.items()))
    return "\n".join(lines) + "\n\n" + "\n".join(verdicts)


def _beats(best: float, times: dict, by_proto: dict) -> str:
    """Whether the best fixed s beats both bsp and asp (one not reaching the target counts as
    beaten; one not run leaves the question open)."""
    if any(p not in by_proto for p in ("bsp", "asp")):
        return "against both: not run"
    beats = all(times.get(p) is None or best < times[p] for p in ("bsp", "asp"))
    return "beats both" if beats else "does not beat both"


def _fmt(t: float | None, unit: str = " s", ran: bool = True) -> str:
    if not ran:
        return "not run"
    return "did not reach it" if t is None else f"{t:.1f}{unit}"


def _ratio(t: float | None, best: float) -> str:
    return "-" if t is None else f"{t / best:.2f}x"


def plot(rows: list[dict], path: Path) -> None:
    """Test accuracy against wall time per scenario and W (first seed); auto's bound below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ws = sorted({r["workers"] for r in rows})
    scenarios = [s for s in SCENARIOS if any(r["scenario"] == s for r in rows)]
    seed = min(r["seed"] for r in rows)
    fig, axes = plt.subplots(len(ws) + 1, len(scenarios), figsize=(5 * len(scenarios),
                                                                   3.6 * (len(ws) + 1)),
                             squeeze=False)
    for j, scenario in enumerate(scenarios):
        for i, w in enumerate(ws):
            ax = axes[i][j]
            for r in rows:
                if (r["scenario"], r["workers"], r["seed"]) == (scenario, w, seed) and \
                        r.get("curve"):
                    t, _, acc = zip(*r["curve"])
                    ax.plot(t, acc, label=r["protocol"],
                            lw=2.2 if r["protocol"] == "ssp auto" else 1.2)
            ax.set(title=f"{scenario}, W={w} (seed {seed})", xlabel="wall time (s)",
                   ylabel="test accuracy", ylim=(0, 1))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        ax = axes[len(ws)][j]
        for r in rows:
            if (r["scenario"], r["seed"], r["protocol"]) == (scenario, seed, "ssp auto") and \
                    r.get("bound"):
                t, b = zip(*r["bound"])
                ax.step(t, b, where="post", label=f"W={r['workers']}")
        ax.set(title=f"{scenario}: --staleness auto's bound", xlabel="wall time (s)",
               ylabel="bound in force (clocks)")
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny subset on synthetic data")
    common.add_output_arguments(ap)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--samples", type=int, default=240, help="steps of all workers together "
                                                             "(each worker: samples / W)")
    ap.add_argument("--every", type=int, default=5, help="clocks between snapshots")
    ap.add_argument("--eval-samples", type=int, default=1000)
    ap.add_argument("--target", type=float, default=0.75)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--staleness-comp", default="auto", help="the servers' staleness "
                                                            "compensation in every run")
    ap.add_argument("--report", metavar="JSON", help="only write the table and plot of the runs "
                                                      "in JSON (e.g. a stopped benchmark's)")
    args = ap.parse_args(argv)
    if args.report:
        return report(Path(args.report))
    if args.quick:
        args.workers, args.seeds, args.model, args.samples = "2", "0", "mlp:784-64-10", 60
        args.scenarios, args.protocols, args.target = "none,slow", "bsp,ssp auto", 0.2
    grid_options(ap, args, scenarios=SCENARIOS, protocols=PROTOCOLS)
    out = common.out_dir(args, "stragglers")
    name = common.result_stem("stragglers-quick" if args.quick else "stragglers", args.quick)
    todo = [{"scenario": sc, "workers": w, "seed": seed, "protocol": p}
            for w in args.workers for seed in args.seeds for sc in args.scenarios
            for p in args.protocols]
    rows = []
    with tempfile.TemporaryDirectory(prefix="psgd-stragglers-") as tmp:
        data, data_name = dataset(Path(tmp), args.quick, "bench-stragglers")
        from psgd.data.reader import ShardReader
        x, y = ShardReader(data, 0, 1, args.batch_size).test_set()
        test = (x[:args.eval_samples], y[:args.eval_samples])
        for i, cell in enumerate(todo):
            row = train({**cell, "index": i}, data, args, Path(tmp), test)
            rows.append(row)
            print(f"[{i + 1}/{len(todo)}] {cell['scenario']} W={cell['workers']} seed "
                  f"{cell['seed']} {cell['protocol']}: to {args.target:g} in "
                  f"{row.get('time_to_target')} s, final {row.get('accuracy', row.get('error'))} "
                  f"({row['wall_s']:.0f} s)", flush=True)
            common.write_json(out / f"{name}.json",
                              {"data": data_name, "settings": vars(args), "rows": rows}, data_name)
    write_report(out, name, data_name, rows, args)
    return 0 if rows and all(r["ok"] for r in rows) else 1


def report(path: Path) -> int:
    """The table and plot of the runs recorded in ``path`` (written beside it)."""
    saved = json.loads(path.read_text())
    args = argparse.Namespace(**saved["settings"])
    write_report(path.parent, path.stem, saved["data"], saved["rows"], args)
    return 0


def write_report(out: Path, name: str, data_name: str, rows: list[dict], args) -> None:
    """``name``.md (the table and verdicts) and ``name``.png in ``out``."""
    text = (f"# Stragglers ({data_name}, {args.model}, momentum 0.9 lr {args.lr:g}, batch "
            f"{args.batch_size} per worker, {args.samples} steps of all workers together, 1 "
            f"server)\n\nTime from the start of training to the first server snapshot "
            f"(every {args.every} clocks) whose accuracy on the first {args.eval_samples} test "
            f"samples reaches {args.target:g} (clocks to it: the snapshot's version, the clocks "
            f"every worker had pushed); final accuracy on the whole test split. Each run "
            f"is W + 1 ranks on {os.cpu_count()} cores (oversubscribed from W = "
            f"{os.cpu_count()} on).\n\n" + table(rows, args) + "\n")
    common.write_text(out / f"{name}.md", text, data_name)
    plot(rows, out / f"{name}.png")
    common.stamp_png(out / f"{name}.png", data_name)
    print(text)


if __name__ == "__main__":
    sys.exit(main())
