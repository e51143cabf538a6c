"""`make bench-compress-accuracy`: final test accuracy with compressed pushes under bsp, ssp and asp.

    .venv/bin/python bench/bench_compress_accuracy.py [--quick] [--workers 2,4] [--seeds 0,1] ...

Every cell is one ``mpiexec -n W+1 python -m psgd train`` (one server), LeNet on
Fashion-MNIST (synthetic data, with a warning, when it is not installed), with the
async-convergence settings (momentum 0.9, lr 0.05, batch 64) and the same epochs for
every compressor: none, fp16, qsgd:4, topk:0.01 and sign (error feedback as ``auto``:
on for topk and sign; momentum correction as ``auto``: on for them), and topk:0.01
without error feedback; with ``--compressors`` also topk and sign with the momentum
left on the server (``no correction``). Writes NAME.{json,md} (NAME-synthetic on synthetic data) into runs/bench/compress-accuracy-TIME/ (--publish: bench/results/) (``--name``,
default compress-accuracy), adding to the json run by run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
from training import dataset, error_line, grid_options, train as run_train  # noqa: E402

PROTOCOLS = {"bsp": ["--protocol", "bsp"], "ssp s=2": ["--protocol", "ssp", "--staleness", "2"],
             "asp": ["--protocol", "asp"]}
COMPRESSORS = {"none": ["--compress", "none"], "fp16": ["--compress", "fp16"],
               "qsgd:4": ["--compress", "qsgd:4"],
               # qsgd scaled by the L2 norm (qsgd:4 scales by the largest magnitude), and with
               # smaller buckets
               "qsgd:4:l2": ["--compress", "qsgd:4:l2"],
               "qsgd:4:l2 bucket 128": ["--compress", "qsgd:4:l2", "--compress-bucket", "128"],
               "topk:0.01": ["--compress", "topk:0.01"],
               "sign": ["--compress", "sign"],
               "topk:0.01 no feedback": ["--compress", "topk:0.01", "--error-feedback", "off"],
               # the servers' momentum with error feedback (what --momentum-correction auto
               # replaces under bsp, ssp and asp)
               "topk:0.01 no correction": ["--compress", "topk:0.01",
                                           "--momentum-correction", "off"],
               "sign no correction": ["--compress", "sign", "--momentum-correction", "off"],
               # the workers' velocities through error feedback (what auto replaces under bsp
               # by the momentum's gain, psgd.compress.gain)
               "topk:0.01 correction on": ["--compress", "topk:0.01",
                                           "--momentum-correction", "on"],
               "sign correction on": ["--compress", "sign", "--momentum-correction", "on"]}
# within this many points of none's mean (the bar); None: shown, no bar
BAR = {"fp16": 0.5, "qsgd:4": 0.5, "qsgd:4:l2": 0.5, "qsgd:4:l2 bucket 128": 0.5,
       "topk:0.01": 1.0, "sign": 1.0}


def train(cell: dict, data: Path, args, tmp: Path) -> dict:
    """One run: its final test accuracy, bytes per push and throughput."""
    log = tmp / f"run{cell['index']}.jsonl"
    flags = ["--data", data, "--model", args.model, *PROTOCOLS[cell["protocol"]],
             *COMPRESSORS[cell["compressor"]], "--optimizer", "momentum", "--lr", args.lr,
             "--momentum", 0.9, "--batch-size", args.batch_size, "--epochs", args.epochs,
             "--seed", cell["seed"], "--eval-every", 0]
    proc, records, wall = run_train(cell["workers"], flags, log, args.timeout)
    summary = next((r for r in records if r["kind"] == "summary"), None)
    row = {**cell, "wall_s": wall, "ok": summary is not None}
    if summary is None:
        row["error"] = error_line(proc)
        return row
    row.update(accuracy=summary["test_accuracy"], test_loss=summary["test_loss"],
               samples_per_s=summary["samples_per_s"],
               push_bytes=summary.get("push_bytes"),
               compression_ratio=summary.get("compression_ratio"))
    comp = (summary.get("staleness_compensation") or [{}])[0]   # the one server's
    row.update(compensation=comp.get("method"), mean_delay=comp.get("mean delay"))
    if "momentum in force" in comp:   # amom: the momentum it set (the workers' with correction)
        row.update(momentum=comp["momentum in force"].get("mean"),
                   lr_factor=comp["learning-rate factor"].get("mean"),
                   mean_delay=comp["mean delay"])
    return row


def table(rows: list[dict]) -> str:
    """Markdown: one line per W, protocol and compressor, over the seeds, beside none's."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["workers"], r["protocol"], r["compressor"]), []).append(r)
    lines = ["| W | protocol | compressor | mean acc | seeds (acc) | vs none | bar | "
             "bytes/push | ratio |", "|---|---|---|---|---|---|---|---|---|"]
    order = list(COMPRESSORS)
    for (w, protocol, comp), runs in sorted(groups.items(), key=lambda kv: (
            kv[0][0], list(PROTOCOLS).index(kv[0][1]), order.index(kv[0][2]))):
        accs = [r["accuracy"] if r["ok"] else 0.0 for r in runs]
        ref = [r["accuracy"] for r in groups.get((w, protocol, "none"), []) if r["ok"]]
        delta = 100 * (statistics.mean(accs) - statistics.mean(ref)) if ref else None
        bar = BAR.get(comp)
        verdict = "-" if bar is None or delta is None else (
            f"{'ok' if round(delta, 6) >= -bar else 'MISSED'} (-{bar:g})")   # float noise off
        ok = [r for r in runs if r["ok"] and r.get("push_bytes")]
        lines.append(
            f"| {w} | {protocol} | {comp} | {statistics.mean(accs):.4f} | "
            f"{', '.join(f'{a:.4f}' for a in accs)} | "
            f"{'-' if delta is None else f'{delta:+.2f} pt'} | {verdict} | "
            f"{statistics.mean(r['push_bytes'] for r in ok):.0f} | "
            f"{statistics.mean(r['compression_ratio'] for r in ok):.1f}x |" if ok else
            f"| {w} | {protocol} | {comp} | {statistics.mean(accs):.4f} | - | - | - | - | - |")
    return "\n".join(lines)


def write_report(out: Path, name: str, data_name: str, rows: list[dict], args) -> None:
    text = (f"# Compressed pushes: final test accuracy ({args.model} on {data_name}, "
            f"{args.epochs:g} epoch(s), momentum 0.9, lr {args.lr:g}, batch {args.batch_size}, "
            f"one server)\n\n`.venv/bin/python bench/bench_compress_accuracy.py "
            f"--workers {','.join(map(str, args.workers))} --seeds "
            f"{','.join(map(str, args.seeds))} --epochs {args.epochs:g} --protocols "
            f"'{','.join(args.protocols)}' --compressors '{','.join(args.compressors)}'`"
            f"\n\n{table(rows)}\n")
    common.write_text(out / f"{name}.md", text, data_name)
    print(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tiny subset on synthetic data")
    common.add_output_arguments(ap)
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS))
    ap.add_argument("--compressors",
                    default=",".join(c for c in COMPRESSORS if "correction" not in c))
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--name", default="compress-accuracy",
                    help="the results' file name in --out, without .json and .md")
    ap.add_argument("--report", metavar="JSON", help="only write the table of the runs in JSON "
                                                      "(e.g. a stopped benchmark's), beside it")
    args = ap.parse_args(argv)
    if args.report:
        saved, out = json.loads(Path(args.report).read_text()), (args.out, args.publish)
        for key, value in saved["settings"].items():
            setattr(args, key, value)
        args.out, args.publish = out
        rows = saved["rows"]
        seeds = sorted({r["seed"] for r in rows})
        args.seeds, args.report = seeds, None
        write_report(common.out_dir(args, "compress-accuracy"), args.name, saved["data"], rows,
                     args)
        return 0
    if args.quick:
        args.workers, args.seeds, args.model, args.epochs = "2", "0", "mlp:784-64-10", 2.0
        args.protocols, args.compressors = "asp", "none,sign"
    grid_options(ap, args, protocols=PROTOCOLS, compressors=COMPRESSORS)
    out = common.out_dir(args, "compress-accuracy")
    name = common.result_stem("compress-accuracy-quick" if args.quick else args.name, args.quick)
    todo = [{"workers": w, "seed": seed, "protocol": p, "compressor": c}
            for seed in args.seeds for w in args.workers for p in args.protocols
            for c in args.compressors]
    rows = []
    with tempfile.TemporaryDirectory(prefix="psgd-compress-acc-") as tmp:
        data, data_name = dataset(Path(tmp), args.quick, "bench-compress-accuracy")
        for i, cell in enumerate(todo):
            row = train({**cell, "index": i}, data, args, Path(tmp))
            rows.append(row)
            print(f"[{i + 1}/{len(todo)}] W={cell['workers']} seed {cell['seed']} "
                  f"{cell['protocol']} {cell['compressor']}: "
                  f"{row.get('accuracy', row.get('error'))} ({row['wall_s']:.0f} s)", flush=True)
            common.write_json(out / f"{name}.json",
                              {"data": data_name, "settings": vars(args), "rows": rows}, data_name)
    write_report(out, name, data_name, rows, args)
    return 0 if rows and all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
