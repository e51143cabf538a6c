"""`make bench-sparse`: sparse hogwild against dense hogwild and scikit-learn's SGDClassifier.

    .venv/bin/python bench/bench_sparse.py [--quick] [--repeats 2] [--epochs 3] ...

On one `psgd data synth --sparse` set (about 1% density): `psgd train --protocol
hogwild --model linear` with 1 and 2 workers (one server), pushing the touched
rows and reading the next batch's rows (sparse: with the hot rows held, the default, and
with ``--hold-hot 1``) or moving the whole vector (``PSGD_X_HOGWILD_SPARSE=off``, dense hogwild); bytes per update are the lead worker's
pushed and read bytes per step.
scikit-learn's SGDClassifier (log loss, one-vs-rest, constant learning rate
lr / batch per sample, the same epochs, no regularisation) trains on the same
file in its own process. Times are whole-process wall times; psgd's sources are
byte-compiled first, as pip compiles an installed package such as scikit-learn. Each run
also records the CPU that processes other than its own used meanwhile (``other_cores``,
in cores: /proc/stat's busy time less the run's children's), since any such process, niced
or not, takes its share of the 2 cores from the run (the kernel's autogroups). Writes
sparse.{json,md} into runs/bench/sparse-TIME/ (--publish: bench/results/); with ``--net RATE`` (root) the psgd runs go through
``psgd net --nodes 2 --rate RATE`` (the server and the second worker on node 0, the
first worker on node 1) and write sparse-net.{json,md}. scikit-learn is needed only here.
With ``--optimizer momentum`` or ``nesterov`` (lazy momentum against the whole-vector push,
no scikit-learn run, which has no momentum) it writes sparse-momentum.{json,md}.
"""
from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
from common import ROOT, run_bounded  # noqa: E402

SKLEARN = """
import sys, time, h5py, numpy as np, scipy.sparse as sp
from sklearn.linear_model import SGDClassifier
path, epochs, eta0, seed = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def load(split):
    with h5py.File(path, "r") as f:
        g, d = f[split], int(f.attrs["n_features"])
        return (sp.csr_matrix((g["values"][()], g["indices"][()], g["indptr"][()]),
                              shape=(len(g["y"]), d)), g["y"][()])
(x, y), (xt, yt) = load("train"), load("test")
clf = SGDClassifier(loss="log_loss", penalty=None, learning_rate="constant", eta0=eta0,
                    max_iter=epochs, tol=None, shuffle=True, random_state=seed, n_jobs=2)
t0 = time.perf_counter()
clf.fit(x, y)
print(clf.score(xt, yt), time.perf_counter() - t0)
"""


def _cpu_clock() -> tuple[float, float]:
    """(CPU seconds the whole machine has been busy, CPU seconds of this process's waited
    children), to tell a run's own CPU from other processes'."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ((user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"),
            children.ru_utime + children.ru_stime)


def timed(cmd: list[str], timeout: float, **kw) -> tuple:
    """run_bounded(cmd); returns (the process, wall seconds, cores' worth of CPU that other
    processes used meanwhile)."""
    busy0, own0 = _cpu_clock()
    t0 = time.perf_counter()
    proc = run_bounded(cmd, timeout, **kw)
    wall = time.perf_counter() - t0
    busy1, own1 = _cpu_clock()
    return proc, wall, max(0.0, (busy1 - busy0) - (own1 - own0)) / wall


def make_data(tmp: Path, args) -> Path:
    out = tmp / "sparse.h5"
    run_bounded([sys.executable, "-m", "psgd", "data", "synth", "--sparse", "-o", str(out),
                 "--train", str(args.train), "--test", str(args.test), "--features",
                 str(args.features), "--nnz", str(args.nnz)], 300, cwd=ROOT).check_returncode()
    return out


def psgd_run(data: Path, workers: int, sparse: bool, args, log: Path, hold: int | None = None) -> dict:
    net = [sys.executable, "-m", "psgd", "net", "--nodes", "2", "--rate", args.net, "--"] \
        if args.net else []
    cmd = [*net, common.mpiexec(), "-n", str(workers + 1), sys.executable, "-m", "psgd",
           "train", "--data", str(data), "--model", "linear", "--protocol", "hogwild",
           "--servers", "1", "--lr", str(args.lr), "--batch-size", str(args.batch_size),
           "--epochs", str(args.epochs), "--log-every", "50", "--quiet", "--log", str(log),
           "--overwrite", "--optimizer", args.optimizer,
           "--staleness-comp", args.staleness_comp, *(["--hold-hot", str(hold)] if hold else [])]
    env = {**os.environ, "PSGD_X_HOGWILD_SPARSE": "on" if sparse else "off"}
    proc, wall, other = timed(cmd, args.timeout, cwd=ROOT, env=env)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    summary = next((r for r in records if r["kind"] == "summary"), None)
    if summary is None:
        raise SystemExit(f"bench-sparse: psgd run failed: {proc.stderr.strip()[-400:]}")
    pushed = [r["push_bytes_per_step"] for r in records
              if r["kind"] == "step" and "push_bytes_per_step" in r]
    pulled = [r["pull_bytes_per_step"] for r in records
              if r["kind"] == "step" and "pull_bytes_per_step" in r]
    n_params = next(r for r in records if r["kind"] == "config")["n_params"]
    name = f"psgd hogwild {'sparse' if sparse else 'dense'}" + (f" --hold-hot {hold}" if hold else "")
    return {"run": name, "workers": workers,
            "process_s": wall, "train_s": summary["wall_s"],
            "updates_per_s": summary["samples_per_s"] / args.batch_size,
            "bytes_per_update": statistics.mean(pushed), "read_bytes_per_update": statistics.mean(pulled),
            "dense_bytes": 4 * n_params,
            "accuracy": summary["test_accuracy"], "other_cores": other}


def sklearn_run(data: Path, args) -> dict:
    proc, wall, other = timed([sys.executable, "-c", SKLEARN, str(data), str(args.epochs),
                               str(args.lr / args.batch_size), "0"], args.timeout)
    if proc.returncode:
        raise SystemExit(f"bench-sparse: sklearn run failed (pip install scikit-learn): "
                         f"{proc.stderr.strip()[-400:]}")
    acc, fit_s = map(float, proc.stdout.split())
    return {"run": "sklearn SGDClassifier", "workers": 2, "process_s": wall, "train_s": fit_s,
            "accuracy": acc, "other_cores": other}


def table(rows: list[dict], args, density: float) -> str:
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["run"], r["workers"]), []).append(r)

    def span(key, runs, fmt):
        vals = [r[key] for r in runs if key in r]
        if not vals:
            return "-"
        lo, hi = min(vals), max(vals)
        return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}..{fmt.format(hi)}"

    where = (f"psgd on `psgd net`'s 2 nodes at {args.net} (server and worker 2 on node 0, "
             f"worker 1 on node 1)" if args.net else "one node")
    lines = [f"Sparse synthetic set: {args.train} train / {args.test} test rows, {args.features} "
             f"features, density {density:.2%}; linear model, 10 classes; batch {args.batch_size}, "
             f"{args.optimizer}, lr {args.lr}, {args.epochs} epochs; {where}; {args.repeats} repeats (ranges).", "",
             "| run | workers | updates/s | bytes pushed/update | bytes read/update | test acc | train s "
             "| process s | other processes' CPU, cores |", "|---|---|---|---|---|---|---|---|---|"]
    for (run, w), runs in groups.items():
        lines.append(f"| {run} | {w} | {span('updates_per_s', runs, '{:.0f}')} | "
                     f"{span('bytes_per_update', runs, '{:.0f}')} | "
                     f"{span('read_bytes_per_update', runs, '{:.0f}')} | {span('accuracy', runs, '{:.4f}')} | "
                     f"{span('train_s', runs, '{:.2f}')} | {span('process_s', runs, '{:.2f}')} | "
                     f"{span('other_cores', runs, '{:.2f}')} |")
    med = {k: statistics.median([r.get("updates_per_s", 0) for r in v]) for k, v in groups.items()}
    byt = {k: statistics.median([r.get("bytes_per_update", 0) for r in v]) for k, v in groups.items()}
    read = {k: statistics.median([r.get("read_bytes_per_update", 0) for r in v]) for k, v in groups.items()}
    proc = {k: statistics.median([r["process_s"] for r in v]) for k, v in groups.items()}
    acc = {k: statistics.median([r["accuracy"] for r in v]) for k, v in groups.items()}
    sp1, sp2 = ("psgd hogwild sparse", 1), ("psgd hogwild sparse", 2)
    dn1, dn2, sk = ("psgd hogwild dense", 1), ("psgd hogwild dense", 2), ("sklearn SGDClassifier", 2)
    lines += ["", f"- bytes per update, dense / sparse: pushed {byt[dn1] / byt[sp1]:.1f}x, read "
              f"{read[dn1] / read[sp1]:.1f}x",
              f"- updates/s, sparse 2 workers / 1: {med[sp2] / med[sp1]:.2f}x; sparse / dense at 1 "
              f"worker: {med[sp1] / med[dn1]:.2f}x, at 2: {med[sp2] / med[dn2]:.2f}x"]
    h1, h2 = ("psgd hogwild sparse --hold-hot 1", 1), ("psgd hogwild sparse --hold-hot 1", 2)
    if h2 in med:
        lines += [f"- updates/s, sparse 2 workers / 1 holding no rows (--hold-hot 1): "
                  f"{med[h2] / med[h1]:.2f}x; 2 workers, held / not: {med[sp2] / med[h2]:.2f}x"]
    if sk in acc:
        lines += [f"- test accuracy, psgd sparse 2 workers - sklearn: "
                  f"{100 * (acc[sp2] - acc[sk]):+.2f} points",
                  f"- process time, psgd sparse 2 workers / sklearn (n_jobs=2): {proc[sp2] / proc[sk]:.2f}x"]
    else:
        lines += [f"- test accuracy, sparse - dense: {100 * (acc[sp1] - acc[dn1]):+.2f} points at 1 "
                  f"worker, {100 * (acc[sp2] - acc[dn2]):+.2f} at 2"]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a small smoke run")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--train", type=int, default=40000)
    p.add_argument("--test", type=int, default=8000)
    p.add_argument("--features", type=int, default=5000)
    p.add_argument("--nnz", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "momentum", "nesterov"))
    p.add_argument("--staleness-comp", default="auto", help="psgd train's (auto: amom for momentum)")
    p.add_argument("--timeout", type=float, default=600)
    common.add_output_arguments(p)
    p.add_argument("--net", help="run psgd on psgd net's 2 emulated nodes at this rate (root)")
    args = p.parse_args()
    if args.quick:
        args.train, args.test, args.repeats, args.epochs = 2000, 400, 1, 1
    out = None if args.quick else common.out_dir(args, "sparse")
    # scikit-learn starts from the .pyc files pip wrote at install; psgd, installed editable,
    # recompiles every module in every rank when PYTHONDONTWRITEBYTECODE is set (as here)
    for package in ("psgd", "kernels"):
        compileall.compile_dir(ROOT / package, quiet=1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(Path(tmp), args)
        from psgd.data.reader import dataset_info
        info = dataset_info(data)
        density = info["train"]["nnz"] / (info["train"]["n"] * args.features)
        for rep in range(args.repeats):
            # sparse (hot rows held, the default), sparse holding none (sgd's runs of steps
            # only), dense; 1 and 2 workers each, side by side
            for sparse, hold in ((True, None), (True, 1), (False, None)):
                if hold and args.optimizer != "sgd":
                    continue
                for w in (1, 2):
                    rows.append(psgd_run(data, w, sparse, args, Path(tmp) / "log.jsonl", hold))
                    print(json.dumps(rows[-1]), flush=True)
            if args.optimizer == "sgd":
                rows.append(sklearn_run(data, args))
                print(json.dumps(rows[-1]), flush=True)
    md = table(rows, args, density)
    print(md)
    if out is not None:
        name = "sparse-net" if args.net else "sparse"
        name += "" if args.optimizer == "sgd" else "-momentum"
        data = (f"sparse synthetic (psgd data synth --sparse --train {args.train} --test "
                f"{args.test} --features {args.features} --nnz {args.nnz})")
        common.write_json(out / f"{name}.json",
                          {"args": {k: str(v) for k, v in vars(args).items()},
                           "density": density, "rows": rows}, data)
        command = "make bench-sparse" + (f" ARGS=\"{' '.join(sys.argv[1:])}\"" if sys.argv[1:] else "")
        common.write_text(out / f"{name}.md", f"# {command}\n\n" + md, data)


if __name__ == "__main__":
    main()
