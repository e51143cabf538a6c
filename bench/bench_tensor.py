"""`make bench-tensor`: a wide MLP split Megatron-style (T) against data parallelism (D) and the grid.

    .venv/bin/python bench/bench_tensor.py [--model mlp:784-4096-4096-10] [--steps 30] [--publish]

Every cell is one ``mpiexec -n D*T python -m psgd train --grid D,T`` on the same synthetic
data and batch per replica; the grid 2,1 is plain data parallelism through the same loop
(gradients averaged by psgd's all-reduce), so the rows differ only in the split. Reported:
the median step time, samples per second (D x batch / step) and the largest per-rank
parameter bytes against the whole model's. The grids run ``--rounds`` times, interleaved
(the 2-core machine is shared, and one run's step times move by half between runs): the
table gives the fastest round and the range. Writes tensor-synthetic.{json,md} into
runs/bench/tensor-TIME/ (--publish: bench/results/ and docs/results/tensor.md).

    .venv/bin/python bench/bench_tensor.py --net 1gbit,10gbit [--model mlp:784-8192-8192-10]

With ``--net RATES`` (root: psgd net) the issue's comparison on 2 emulated nodes at each
rate: `psgd plan --auto`'s tensor 1x2 plan (``--grid 1,2``) against its plain allreduce
W=2 plan (psgd's allreduce protocol) and its fastest auto-grid plan (``--grid D,auto``), each run as bench/bench_plan.py runs a plan under
``psgd net --nodes 2`` and beside the search's prediction for that link (bench_plan's
budget: one shared link, rank r on node r mod 2, the ranks sharing this machine's cores;
the profile taken at the runs' batch, as a weight-heavy layer's time per sample falls with
the batch). Writes tensor-net-synthetic.{json,md}.

    .venv/bin/python bench/bench_tensor.py --pipeline 2 [--model ..] [--microbatches 4]

With ``--pipeline K`` the grid with a pipeline, ranks = D x K x T: K stages split over T = 2
parts (``--pipeline K --tensor 2``, 2K ranks) against the unsplit pipeline on the same ranks
(D = 2 replicas of K stages) and on half of them (one replica of K stages), interleaved for
``--rounds`` in the same run; samples/s is the pipeline summary's (after the first step).
Writes tensor-pipeline-synthetic.{json,md}. ``--pipeline-axis spatial``: the stages split by
image rows (``--spatial 2``; give a conv ``--model``) instead; writes spatial-pipeline-*.
A row with more ranks than this machine's cores is marked oversubscribed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
from common import ROOT, mpiexec, run_bounded  # noqa: E402

GRIDS = [(1, 1), (1, 2), (2, 1), (2, 2)]


def cell(data: Path, d: int, t: int, args, log: Path) -> dict:
    cmd = [mpiexec(), "-n", str(d * t), sys.executable, "-m", "psgd", "train", "--data", str(data),
           "--model", args.model, "--protocol", "allreduce", "--grid", f"{d},{t}", "--optimizer",
           "momentum", "--lr", "0.01", "--batch-size", str(args.batch_size), "--steps",
           str(args.steps), "--quiet", "--log", str(log), "--eval-samples", "64"]
    proc = run_bounded(cmd, args.timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"bench-tensor: grid {d},{t} failed: {proc.stderr.strip()[-400:]}")
    summary = [json.loads(x) for x in log.read_text().splitlines() if '"summary"' in x][-1]
    ms = summary["step_ms"]
    return {"D": d, "T": t, "ranks": d * t, "step_ms": round(ms, 2),
            "samples_per_s": round(d * args.batch_size / ms * 1e3, 1),
            "param_bytes_per_rank": summary["param_bytes_per_rank"],
            "param_bytes_serial": summary["param_bytes_serial"], "test_loss": summary["test_loss"]}


def best(rounds: list) -> dict:
    """The fastest round of one grid, with every round's step time."""
    row = dict(min(rounds, key=lambda r: r["step_ms"]))
    row["step_ms_rounds"] = [r["step_ms"] for r in rounds]
    return row


def table(rows: list, args) -> str:
    lines = [f"Model `{args.model}`, batch {args.batch_size} per replica, {args.steps} steps, "
             f"momentum SGD; median step over steps 2..{args.steps}, the fastest of "
             f"{args.rounds} interleaved rounds (range beside it).", "",
             "| D x T | ranks | step (ms) | range (ms) | samples/s | params per rank (MB) | of the whole |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        span = f"{min(r['step_ms_rounds']):.1f}-{max(r['step_ms_rounds']):.1f}"
        lines.append(f"| {r['D']} x {r['T']} | {r['ranks']} | {r['step_ms']:.1f} | {span} | {r['samples_per_s']:.0f} "
                     f"| {r['param_bytes_per_rank'] / 1e6:.1f} | "
                     f"{r['param_bytes_per_rank'] / r['param_bytes_serial']:.3f} |")
    return "\n".join(lines)


def net_rows(args) -> list:
    """Per rate: the tensor 1x2, the plain allreduce W=2 and the fastest auto-grid plans,
    predicted and measured."""
    from types import SimpleNamespace

    import bench_plan
    from psgd.plan.auto import get_profile
    from psgd.plan.search import search
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.h5"
        if args.image_side:
            big_images(data, args.image_side)
        else:
            run_bounded([sys.executable, "-m", "psgd", "data", "synth", "--train", "2048", "--test", "256",
                         "--channels", str(args.channels), "-o", str(data)], 300, cwd=ROOT).check_returncode()
        prof = get_profile(args.model, str(Path(tmp) / "profile.json"), args.batch_size, str(data))
        for rate in args.net.split(","):
            run = SimpleNamespace(rate=rate, ranks=2, per_node=1, batch_size=args.batch_size,
                                  steps=3, seconds=args.seconds, timeout=args.timeout)
            plans, _ = search(prof, bench_plan.bench_budget(run, 1 << 40, data))
            split = "spatial" if args.image_side else "tensor"
            picked = [next(p for p in plans if p.kind == split and p.replicas == 1),
                      next(p for p in plans if p.kind == "data" and p.protocol == "allreduce"
                           and not p.compress and not p.servers)]
            picked += [p for p in plans if p.kind == "grid"][:0 if args.image_side else 1]
            for plan in picked:
                log = Path(tmp) / f"{rate}-{plan.kind}.jsonl"
                measured = bench_plan.measured_rate(plan, data, args.model, run, log)
                rows.append({"rate": rate, "plan": plan.label(), "args": " ".join(plan.train_args()),
                             "predicted": round(plan.samples_per_s, 1), "measured": round(measured, 1),
                             "ratio": round(measured / plan.samples_per_s, 3)})
                print(json.dumps(rows[-1]), flush=True)
            if not args.image_side:
                rows.append(plain_auto_row(plans, data, args, run, Path(tmp) / f"{rate}-auto.jsonl"))
                print(json.dumps(rows[-1]), flush=True)
    return rows


def big_images(path: Path, side: int, n_train: int = 512, n_test: int = 64) -> None:
    """The colour synthetic set (3x32x32) scaled up to 3 x ``side`` x ``side`` (a multiple of
    32) by repeating pixels: images large enough for --spatial to split every conv layer."""
    import numpy as np

    from psgd.data import layout
    from psgd.data.synth import N_CLASSES, make_synthetic
    if side % 32:
        raise SystemExit(f"bench-tensor: --image-side {side} is not a multiple of 32")
    x, y, xt, yt = make_synthetic(n_train, n_test, 0, 3)
    up = [np.repeat(np.repeat(a, side // 32, axis=2), side // 32, axis=3) for a in (x, xt)]
    layout.write_dataset(path, up[0], y, up[1], yt, n_classes=N_CLASSES, scale=layout.UINT8_SCALE,
                         offset=0.0, source=f"synth:seed=0,channels=3,side={side}", normalize=True)


def plain_auto_row(plans: list, data: Path, args, run, log: Path) -> dict:
    """``psgd train --grid auto`` (D and T its own choice) on the same link, beside the plan of
    the grid it chose: the auto-grid row D x T, or the allreduce row when T = 1."""
    from types import SimpleNamespace

    import bench_plan
    grid = next(p for p in plans if p.kind == "grid")
    flags = ["--protocol", "allreduce", "--batch-size", str(args.batch_size), "--grid", "auto",
             *grid.extra["network"]]
    probe = SimpleNamespace(ranks=2, replicas=1, batch=args.batch_size, samples_per_s=grid.samples_per_s,
                            train_args=lambda: flags, label=lambda: "--grid auto")
    per_replica = bench_plan.measured_rate(probe, data, args.model, run, log)
    summary = [json.loads(x) for x in log.read_text().splitlines() if '"summary"' in x][-1]
    d, t = summary["grid"]
    plan = next(p for p in plans if (p.kind == "grid" and (p.replicas, p.parts) == (d, t)) or
                (t == 1 and p.kind == "data" and p.protocol == "allreduce" and not p.compress
                 and not p.servers and p.replicas == d))
    measured = d * per_replica
    return {"rate": run.rate, "plan": f"--grid auto: {d}x{t} ({summary['auto_head']} cut "
                                      f"{summary['auto_cut']}); predicted as {plan.label()}",
            "args": " ".join(flags), "predicted": round(plan.samples_per_s, 1), "measured": round(measured, 1),
            "ratio": round(measured / plan.samples_per_s, 3)}


def net_table(rows: list, args) -> str:
    images = f" on 3x{args.image_side}x{args.image_side} images" if args.image_side else ""
    lines = [f"Model `{args.model}`{images}, batch {args.batch_size} per replica, on `psgd net --nodes 2 "
             f"--rate RATE` (one shared link, rank r on node r mod 2; this machine's cores shared).",
             "", "| rate | plan | psgd train flags | predicted samples/s | measured | measured/predicted |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['rate']} | {r['plan']} | `{r['args']}` | {r['predicted']:.1f} | {r['measured']:.1f} "
              f"| {r['ratio']:.2f} |" for r in rows]
    split = "spatial" if args.image_side else "tensor"
    for rate in dict.fromkeys(r["rate"] for r in rows):
        part, data = (next(r for r in rows if r["rate"] == rate and r["plan"].startswith(k))
                      for k in (split, "allreduce"))
        lines.append(f"\n{rate}: {split} 1x2 / allreduce W=2 measured {part['measured'] / data['measured']:.2f}x, "
                     f"predicted {part['predicted'] / data['predicted']:.2f}x.")
    return "\n".join(lines)


def main_net(args) -> None:
    out, rows = common.out_dir(args, "tensor-net"), net_rows(args)
    body = net_table(rows, args)
    stem = common.result_stem("tensor-net", True)
    common.write_json(out / f"{stem}.json", {"rows": rows, "model": args.model}, common.SYNTHETIC)
    common.write_text(out / f"{stem}.md", body, common.SYNTHETIC)
    print(body)


PIPELINE_GRIDS = [(1, 1), (2, 1), (1, 2)]   # (D, T) of a K-stage pipeline


def pipeline_cell(data: Path, d: int, t: int, args, log: Path) -> dict:
    """One ``--pipeline K`` run of D replicas of K stages, each split over T parts."""
    k = args.pipeline
    cmd = [mpiexec(), "-n", str(d * k * t), sys.executable, "-m", "psgd", "train", "--data",
           str(data), "--model", args.model, "--optimizer", "momentum", "--lr", "0.01",
           "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--quiet", "--log",
           str(log), "--eval-samples", "64", "--pipeline", str(k), "--microbatches",
           str(args.microbatches), "--schedule", "gpipe", "--recompute", "on"]
    cmd += [f"--{args.pipeline_axis}", str(t)] if t > 1 else []
    proc = run_bounded(cmd, args.timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"bench-tensor: pipeline {d}x{k}x{t} failed: {proc.stderr.strip()[-400:]}")
    summary = [json.loads(x) for x in log.read_text().splitlines() if '"summary"' in x][-1]
    return {"D": d, "K": k, "T": t, "ranks": d * k * t,
            "samples_per_s": round(summary["pipeline"]["samples_per_s"], 1),
            "param_bytes": summary["pipeline"]["param_bytes"], "test_loss": summary["test_loss"]}


def pipeline_table(rows: list, args) -> str:
    base = next(r for r in rows if r["D"] == 1 and r["T"] == 1)["samples_per_s"]
    same = {r["ranks"]: r["samples_per_s"] for r in rows if r["T"] == 1}
    x = "P" if args.pipeline_axis == "spatial" else "T"
    lines = [f"Model `{args.model}`, stages split by --{args.pipeline_axis}, batch "
             f"{args.batch_size} per replica in {args.microbatches} microbatches, gpipe, "
             f"--recompute on, {args.steps} steps, momentum SGD; samples/s after the first step, "
             f"the best of {args.rounds} interleaved rounds (range beside it).",
             "", f"| D x K x {x} | ranks | samples/s | range | vs 1 x K x 1 | vs unsplit on the same "
             "ranks | parameter bytes per stage (rank of part 0) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        over = " (oversubscribed)" if r["ranks"] > (os.cpu_count() or 1) else ""
        lines.append(f"| {r['D']} x {r['K']} x {r['T']} | {r['ranks']}{over} | {r['samples_per_s']:.0f} "
                     f"| {min(r['rounds']):.0f}-{max(r['rounds']):.0f} | {r['samples_per_s'] / base:.2f} "
                     f"| {r['samples_per_s'] / same[r['ranks']]:.2f} | {r['param_bytes']} |")
    return "\n".join(lines)


def main_pipeline(args) -> None:
    out = common.out_dir(args, "tensor")
    with tempfile.TemporaryDirectory() as tmp:
        data = common.dataset(Path(tmp), True, "bench-tensor", train=4096)
        runs = {grid: [] for grid in PIPELINE_GRIDS}
        for k in range(args.rounds):
            for d, t in PIPELINE_GRIDS:
                runs[d, t].append(pipeline_cell(data.path, d, t, args, Path(tmp) / f"p{d}{t}-{k}.jsonl"))
                print(json.dumps(runs[d, t][-1]), flush=True)
    rows = []
    for grid in PIPELINE_GRIDS:
        row = dict(max(runs[grid], key=lambda r: r["samples_per_s"]))
        row["rounds"] = [r["samples_per_s"] for r in runs[grid]]
        rows.append(row)
    stem = common.result_stem(f"{args.pipeline_axis}-pipeline", True)
    body = pipeline_table(rows, args)
    common.write_json(out / f"{stem}.json", {"rows": rows, "model": args.model}, data.name)
    common.write_text(out / f"{stem}.md", body, data.name)
    print(body)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp:784-4096-4096-10")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--net", default=None, metavar="RATES",
                    help="e.g. 1gbit,10gbit: tensor 1x2 against allreduce W=2 on psgd net's 2 nodes")
    ap.add_argument("--channels", type=int, default=1, help="--net: 1 (1x28x28 images) or 3 (3x32x32, "
                                                                   "for cifar-cnn)")
    ap.add_argument("--seconds", type=float, default=8.0, help="--net: predicted seconds per run")
    ap.add_argument("--image-side", type=int, default=None, metavar="S",
                    help="--net: a conv --model on 3 x S x S images (S a multiple of 32): its "
                         "spatial 1x2 plan against allreduce W=2")
    ap.add_argument("--pipeline", type=int, default=None, metavar="K",
                    help="K-stage pipelines split over T = 2 (D x K x T) against unsplit ones")
    ap.add_argument("--microbatches", type=int, default=4, help="--pipeline: microbatches per batch")
    ap.add_argument("--pipeline-axis", choices=("tensor", "spatial"), default="tensor",
                    help="--pipeline: split the stages by --tensor 2 or --spatial 2")
    common.add_output_arguments(ap)
    args = ap.parse_args()
    if args.pipeline:
        return main_pipeline(args)
    if args.net:
        return main_net(args)
    out = common.out_dir(args, "tensor")
    with tempfile.TemporaryDirectory() as tmp:
        data = common.dataset(Path(tmp), True, "bench-tensor", train=4096)
        runs = {grid: [] for grid in GRIDS}
        for k in range(args.rounds):
            for d, t in GRIDS:
                runs[d, t].append(cell(data.path, d, t, args, Path(tmp) / f"g{d}{t}-{k}.jsonl"))
                print(json.dumps(runs[d, t][-1]), flush=True)
        rows = [best(runs[grid]) for grid in GRIDS]
    stem = common.result_stem("tensor", True)
    body = table(rows, args)
    files = [common.write_json(out / f"{stem}.json", {"rows": rows, "model": args.model}, data.name),
             common.write_text(out / f"{stem}.md", body, data.name)]
    print(body)
    if args.publish:
        common.docs_page("tensor", "Tensor parallelism: the wide MLP",
                         "Per-step time and per-rank parameter memory of a wide MLP split over T "
                         "ranks (`--tensor`), against data parallelism over D and the D x T grid "
                         "(`make bench-tensor`).", body, files)


if __name__ == "__main__":
    main()
