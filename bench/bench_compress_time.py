"""`make bench-compress-time`: time to a target training accuracy with compression on a slow link.

    .venv/bin/python bench/bench_compress_time.py [--quick] [--rate 1gbit] [--compressors none,sign]

Each row is one ``psgd net --nodes 2 --rate R -- mpiexec -n W python -m psgd train
--protocol allreduce`` (a worker per emulated node) of an MLP of about 2M parameters on
Fashion-MNIST (synthetic data, with a warning, when it is not installed): the seconds
until the lead's running training accuracy first reaches --target, beside the final
test accuracy and the bytes each worker sent per step. Needs root (psgd net); writes
compress-time.{md,json} into runs/bench/compress-time-TIME/ (--publish: bench/results/).
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
from training import dataset, error_line, on_nodes, time_to_target  # noqa: E402

PY = sys.executable


def run(args, data: Path, spec: str, log: Path) -> dict:
    cmd = [*on_nodes(2, args.rate), mpiexec(), "-n", str(args.workers),
           PY, "-m", "psgd", "train", "--data", str(data), "--model", args.model,
           "--protocol", "allreduce", "--servers", "0", "--compress", spec,
           "--optimizer", "momentum", "--lr", str(args.lr), "--momentum", "0.9",
           "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--seed", "0",
           "--eval-every", "0", "--log-every", "5", "--quiet", "--log", str(log)]
    proc = run_bounded(cmd, args.timeout, cwd=ROOT)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    summary = next((r for r in records if r["kind"] == "summary"), None)
    if summary is None:
        return {"compressor": spec, "ok": False, "error": error_line(proc)}
    steps = [r for r in records if r["kind"] == "step"]
    return {"compressor": spec, "ok": True, "accuracy": summary["test_accuracy"],
            "wall_s": summary["wall_s"], "steps": summary["steps"],
            "step_ms": 1e3 * summary["wall_s"] / max(summary["steps"], 1),
            "bytes_per_step": steps[-1].get("push_bytes_per_step") if steps else None,
            "time_to_target": time_to_target(records, args.target)}


def markdown(rows: list[dict], args, data_name: str) -> str:
    base = next((r for r in rows if r["compressor"] == "none" and r["ok"]), None)
    lines = [f"# Compressed all-reduce on an emulated {args.rate} link: {args.model}, "
             f"{args.workers} workers on 2 nodes, {data_name}", "",
             f"`.venv/bin/python bench/bench_compress_time.py --rate {args.rate} --compressors "
             f"{','.join(args.compressors)} --epochs {args.epochs:g} --target {args.target:g}`",
             "", f"| compressor | ms per step | s to train acc {args.target:g} | vs none | "
             "final test acc | bytes sent per worker step |", "|---|---|---|---|---|---|"]
    for r in rows:
        if not r["ok"]:
            lines.append(f"| {r['compressor']} | failed: {r['error']} | | | | |")
            continue
        t = r["time_to_target"]
        gain = (f"{base['time_to_target'] / t:.1f}x sooner" if base and t and
                base.get("time_to_target") else "-")
        sent = "-" if not r["bytes_per_step"] else f"{r['bytes_per_step']:.0f}"
        if r["compressor"] == "none":    # psgd's ring does not count its bytes
            from psgd.nn.model import build_model
            w = args.workers
            sent = f"{2 * (w - 1) / w * 4 * build_model(args.model).n_params:.0f} (the ring's)"
        lines.append(f"| {r['compressor']} | {r['step_ms']:.0f} | "
                     f"{'not reached' if t is None else f'{t:.1f}'} | {gain} | "
                     f"{r['accuracy']:.4f} | {sent} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run on synthetic data")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--compressors", default="none,fp16,qsgd:4,topk:0.01,sign")
    ap.add_argument("--model", default="mlp:784-2048-256-10")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--timeout", type=float, default=600)
    common.add_output_arguments(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.model, args.epochs, args.target, args.compressors = "mlp:784-64-10", 1.0, 0.2, \
            "none,sign"
    args.compressors = args.compressors.split(",")
    out = common.out_dir(args, "compress-time")
    name = common.result_stem("compress-time-quick" if args.quick else "compress-time", args.quick)
    rows = []
    with tempfile.TemporaryDirectory(prefix="psgd-compress-time-") as tmp:
        data, data_name = dataset(Path(tmp), args.quick, "bench-compress-time")
        for spec in args.compressors:
            rows.append(run(args, data, spec, Path(tmp) / f"{spec.replace(':', '')}.jsonl"))
            print(rows[-1], flush=True)
            common.write_json(out / f"{name}.json",
                              {"data": data_name, "settings": vars(args), "rows": rows}, data_name)
    text = markdown(rows, args, data_name)
    common.write_text(out / f"{name}.md", text, data_name)
    print(text)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
