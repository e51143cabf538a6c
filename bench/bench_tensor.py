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
"""
from __future__ import annotations

import argparse
import json
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp:784-4096-4096-10")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    common.add_output_arguments(ap)
    args = ap.parse_args()
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
