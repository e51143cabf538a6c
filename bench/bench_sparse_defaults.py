"""`make bench-sparse`, second part: psgd's sparse defaults against scikit-learn's on real text.

    make bench-sparse ARGS="[--quick] [--repeats 3] [--epochs 5] [--publish]"

Two files: the man-page text set (bench/text_corpus.py, then `psgd data text`: TF-IDF with
L2-normalised rows) and a `psgd data synth --sparse` set. On each, `psgd train --model M`
with no optimizer, lr or schedule flag (the sparse default), 5 epochs, 1 server, hogwild
on 2 workers, then bsp and asp; and scikit-learn's SGDClassifier with its defaults
(loss log_loss for linear, hinge for svm) and max_iter=5, on the same file in its own
process. Times are whole-process wall times of each command (psgd's sources byte-compiled
first, as pip compiles scikit-learn). Writes sparse-defaults.{json,md}, stamped, into
runs/bench/ (--publish: bench/results/).
"""
from __future__ import annotations

import argparse
import compileall
import json
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
from protocols import run_bounded  # noqa: E402
from text_corpus import build  # noqa: E402

DATA = "man-page TF-IDF (bench/text_corpus.py) and psgd data synth --sparse"

SKLEARN = """
import sys, time, warnings, h5py, numpy as np, scipy.sparse as sp
from sklearn.linear_model import SGDClassifier
from sklearn.exceptions import ConvergenceWarning
warnings.simplefilter("ignore", ConvergenceWarning)   # max_iter=5 stops before tol is met
path, loss, epochs, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def load(split):
    with h5py.File(path, "r") as f:
        g, d = f[split], int(f.attrs["n_features"])
        return (sp.csr_matrix((g["values"][()], g["indices"][()], g["indptr"][()]),
                              shape=(len(g["y"]), d)), g["y"][()])
(x, y), (xt, yt) = load("train"), load("test")
t0 = time.perf_counter()
clf = SGDClassifier(loss=loss, max_iter=epochs, random_state=seed).fit(x, y)
print(clf.score(xt, yt), time.perf_counter() - t0)
"""
LOSS = {"linear": "log_loss", "svm": "hinge"}


def make_data(tmp: Path, args) -> dict:
    corpus = build(tmp / "corpus", seed=0, test_fraction=0.3)
    text = tmp / "text.h5"
    cmd = [sys.executable, "-m", "psgd", "data", "text", str(tmp / "corpus"), "-o", str(text)]
    run_bounded(cmd, 600, cwd=ROOT).check_returncode()
    synth = tmp / "synth.h5"
    run_bounded([sys.executable, "-m", "psgd", "data", "synth", "--sparse", "-o", str(synth),
                 "--train", str(args.train), "--test", str(args.test)], 300,
                cwd=ROOT).check_returncode()
    print(f"text corpus: {corpus}", flush=True)
    return {"man-page text": text, "synthetic sparse": synth}


def psgd_run(data: Path, model: str, protocol: str, workers: int, args, log: Path) -> dict:
    cmd = [common.mpiexec(), "-n", str(workers + 1), sys.executable, "-m", "psgd",
           "train", "--data", str(data), "--model", model, "--protocol", protocol, "--servers", "1",
           "--epochs", str(args.epochs), "--quiet", "--log", str(log), "--overwrite"]
    t0 = time.perf_counter()
    proc = run_bounded(cmd, args.timeout, cwd=ROOT)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    summary = next((r for r in records if r["kind"] == "summary"), None)
    if proc.returncode or summary is None:
        raise SystemExit(f"bench-sparse: psgd run failed: {proc.stderr.strip()[-400:]}")
    config = next(r for r in records if r["kind"] == "config")
    return {"run": f"psgd {protocol}, {workers} workers", "process_s": wall,
            "train_s": summary["wall_s"], "accuracy": summary["test_accuracy"],
            "defaults": f"{config['optimizer']} {config['lr_schedule']} lr {config['lr']} "
                        f"batch {config['batch_size']}"}


def sklearn_run(data: Path, model: str, args) -> dict:
    t0 = time.perf_counter()
    proc = run_bounded([sys.executable, "-c", SKLEARN, str(data), LOSS[model], str(args.epochs),
                        "0"], args.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"bench-sparse: sklearn run failed: {proc.stderr.strip()[-400:]}")
    acc, fit_s = map(float, proc.stdout.split())
    return {"run": f"sklearn SGDClassifier(loss={LOSS[model]!r}, max_iter={args.epochs})",
            "process_s": wall, "train_s": fit_s, "accuracy": acc}


def span(values, fmt):
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)}..{fmt.format(hi)}"


def table(rows: list[dict], info: dict) -> str:
    lines = []
    for (name, model), group in _groups(rows).items():
        i = info[name]
        lines += [f"### {name}, --model {model}", "",
                  f"{i['train']} train / {i['test']} test rows, {i['features']} features, "
                  f"{i['classes']} classes, density {i['density']:.3%}.", "",
                  "| run | defaults | test accuracy | train s | process s |", "|---|---|---|---|---|"]
        for run, runs in group.items():
            lines.append(f"| {run} | {runs[0].get('defaults', 'scikit-learn defaults')} | "
                         f"{span([r['accuracy'] for r in runs], '{:.4f}')} | "
                         f"{span([r['train_s'] for r in runs], '{:.2f}')} | "
                         f"{span([r['process_s'] for r in runs], '{:.2f}')} |")
        sk = next(v for k, v in group.items() if k.startswith("sklearn"))
        for run, runs in group.items():
            if run.startswith("psgd"):
                gaps = [100 * (a["accuracy"] - b["accuracy"]) for a, b in zip(runs, sk)]
                ratio = [a["process_s"] / b["process_s"] for a, b in zip(runs, sk)]
                lines.append(f"- {run} - sklearn: accuracy {span(gaps, '{:+.2f}')} points, "
                             f"process time {span(ratio, '{:.2f}')}x (paired by repeat)")
        lines.append("")
    return "\n".join(lines)


def _groups(rows):
    out: dict = {}
    for r in rows:
        out.setdefault((r["data"], r["model"]), {}).setdefault(r["run"], []).append(r)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small smoke run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--train", type=int, default=40000, help="synthetic set's training rows")
    p.add_argument("--test", type=int, default=8000)
    p.add_argument("--models", default="linear", help="comma-separated: linear, svm")
    p.add_argument("--protocols", default="hogwild,bsp,asp")
    p.add_argument("--timeout", type=float, default=600)
    common.add_output_arguments(p)
    args, _ = p.parse_known_args()   # bench_sparse.py's flags, given to both by ARGS, pass
    out = None if args.quick else common.out_dir(args, "sparse-defaults")   # before any run
    if args.quick:
        args.train, args.test, args.repeats, args.epochs = 2000, 400, 1, 1
    for package in ("psgd", "kernels"):
        compileall.compile_dir(ROOT / package, quiet=1)
    rows, info = [], {}
    with tempfile.TemporaryDirectory(prefix="psgd-bench-text-") as tmp:
        files = make_data(Path(tmp), args)
        from psgd.data.reader import dataset_info
        for name, path in files.items():
            d = dataset_info(path)
            info[name] = {"train": d["train"]["n"], "test": d["test"]["n"],
                          "features": d["input_shape"][0], "classes": d["n_classes"],
                          "density": d["train"]["nnz"] / (d["train"]["n"] * d["input_shape"][0])}
        for rep in range(args.repeats):
            for name, path in files.items():
                for model in args.models.split(","):
                    row = sklearn_run(path, model, args)
                    rows.append({"data": name, "model": model, "repeat": rep, **row})
                    print(json.dumps(rows[-1]), flush=True)
                    for protocol in args.protocols.split(","):
                        row = psgd_run(path, model, protocol, 2, args, Path(tmp) / "log.jsonl")
                        rows.append({"data": name, "model": model, "repeat": rep, **row})
                        print(json.dumps(rows[-1]), flush=True)
    md = table(rows, info)
    print(md)
    if out is not None:
        common.write_json(out / "sparse-defaults.json",
                          {"args": {k: str(v) for k, v in vars(args).items()}, "info": info,
                           "rows": rows}, DATA)
        common.write_text(out / "sparse-defaults.md",
                          f"{args.repeats} repeats (ranges)\n\n" + md, DATA)
        print(f"wrote {out}/sparse-defaults.{{json,md}}")

if __name__ == "__main__":
    main()
