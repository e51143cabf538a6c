"""Protocol comparison, single-process (COST) baseline and worker scaling of ``psgd train`` on one dataset.

Every distributed run is ``mpiexec -n R python -m psgd train`` with the same
model, seed, optimizer, learning rate, batch size and number of epochs; its
JSON-lines log gives throughput, evaluations (for time to a target test
accuracy), the staleness histogram and the worker time split.  The baseline is
:func:`psgd.nn.serial.train_serial` in one process on the same data, evaluated on
the same test samples at the same global-sample interval.

Run ``python bench/protocols.py baseline --data F --json OUT ...`` for the
baseline alone (run_all.py launches it this way, once with one BLAS thread and
once with the BLAS default); the rest is called from bench/run_all.py.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from common import ROOT, mpiexec, run_bounded  # noqa: F401 (run_bounded: for run_all)

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# (name, protocol, servers, extra flags)
PROTOCOLS = [
    ("bsp", "bsp", 1, []),
    ("ssp s=1", "ssp", 1, ["--staleness", "1"]),
    ("ssp s=4", "ssp", 1, ["--staleness", "4"]),
    ("asp", "asp", 1, []),
    ("hogwild", "hogwild", 1, []),
    ("allreduce", "allreduce", 0, []),
]


def train_command(cfg: dict, protocol: str, servers: int, workers: int, extra: list[str],
                  log: Path) -> list[str]:
    """The ``mpiexec ... psgd train`` command line of one run (``cfg``: the shared settings)."""
    eval_every = max(1, round(cfg["eval_every_samples"] / (cfg["batch_size"] * workers)))
    return [mpiexec(), "-n", str(servers + workers), sys.executable, "-m", "psgd", "train",
            "--data", str(cfg["data"]), "--model", cfg["model"], "--protocol", protocol,
            "--servers", str(servers), *extra, "--optimizer", cfg["optimizer"],
            "--lr", str(cfg["lr"]), "--batch-size", str(cfg["batch_size"]),
            "--epochs", str(cfg["epochs"]), "--seed", str(cfg["seed"]),
            "--eval-every", str(eval_every), "--eval-samples", str(cfg["eval_samples"]),
            "--log-every", "10", "--log", str(log), "--quiet"]


def display_command(cmd: list[str], data, log: Path) -> str:
    """``cmd`` as a reader would type it from the repository root (no temp paths)."""
    names = {sys.executable: ".venv/bin/python", mpiexec(): "mpiexec",
             str(data): "synth.h5", str(log): f"logs/{log.name}"}
    return " ".join(names.get(c, c) for c in cmd)


def time_to_target(evals: list[tuple[float, float]], target: float) -> float | None:
    """First time (s) at which an evaluation reached ``target`` test accuracy, else None."""
    return next((t for t, acc in evals if acc >= target), None)


def summarize_log(path: Path, target: float) -> dict:
    """The numbers the report needs from one ``psgd train`` log."""
    from psgd.run.metrics import read_log
    records = read_log(path)
    summary = next(r for r in records if r["kind"] == "summary")
    evals = [(r["time"], r["test_accuracy"]) for r in records if r["kind"] == "eval"]
    hist = summary.get("staleness_histogram") or []
    n = sum(hist)
    mean = sum(i * c for i, c in enumerate(hist)) / n if n else 0.0
    return {"samples_per_s": summary["samples_per_s"], "wall_s": summary["wall_s"],
            "samples": summary["samples"], "final_accuracy": summary["test_accuracy"],
            "time_to_target_s": time_to_target(evals, target), "evals": evals,
            "staleness_histogram": hist, "staleness_mean": mean,
            "staleness_max": len(hist) - 1 if hist else 0,
            "worker_time": summary["worker_time"],
            "server_cpu_fraction": summary.get("server_cpu_fraction") or []}


def run_training(cfg: dict, name: str, protocol: str, servers: int, workers: int,
                 extra: list[str], logdir: Path, timeout: float, env_extra: dict | None = None,
                 tag: str = "") -> dict:
    """Launch one training run under a timeout; returns its summary (or an ``error``)."""
    log = logdir / f"{protocol}{''.join(extra[1:])}_w{workers}{tag}.jsonl"
    cmd = train_command(cfg, protocol, servers, workers, extra, log)
    env = dict(os.environ, **(ONE_THREAD if env_extra is None else env_extra))
    row = {"name": name, "protocol": protocol, "servers": servers, "workers": workers,
           "ranks": servers + workers, "oversubscribed": servers + workers > cfg["cores"],
           "blas_threads": env.get("OPENBLAS_NUM_THREADS", "default"), "log": str(log),
           "command": display_command(cmd, cfg["data"], log)}
    t0 = time.perf_counter()
    try:
        proc = run_bounded(cmd, timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        row["error"] = f"timed out after {timeout:.0f} s"
        return row
    row["process_s"] = time.perf_counter() - t0
    if proc.returncode != 0:
        row["error"] = f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}"
        return row
    row.update(summarize_log(log, cfg["target_accuracy"]))
    print(f"  {name:<10} W={workers} S={servers}: {row['samples_per_s']:7.0f} samples/s, "
          f"final acc {row['final_accuracy']:.3f}, to {cfg['target_accuracy']:.2f}: "
          f"{row['time_to_target_s'] if row['time_to_target_s'] is not None else '-'} s "
          f"({row['process_s']:.1f} s with start-up)", flush=True)
    return row


def compare_protocols(cfg: dict, workers: tuple[int, ...], logdir: Path, timeout: float) -> list[dict]:
    """Every protocol of PROTOCOLS at each worker count."""
    return [run_training(cfg, name, proto, servers, w, extra, logdir, timeout)
            for w in workers for name, proto, servers, extra in PROTOCOLS]


def scaling(cfg: dict, workers: tuple[int, ...], protocols: tuple[str, ...], done: list[dict],
            logdir: Path, timeout: float, single_samples_per_s: float | None) -> list[dict]:
    """Throughput against the number of workers; reuses matching runs from ``done``.

    Per-core efficiency = samples/s / (min(W, cores) x single-process samples/s).
    """
    rows = []
    for proto in protocols:
        name, _, servers, extra = next(p for p in PROTOCOLS if p[0] == proto)
        for w in workers:
            row = next((r for r in done if r["name"] == proto and r["workers"] == w
                        and "error" not in r), None)
            if row is None:
                row = run_training(cfg, name, _, servers, w, extra, logdir, timeout)
            rows.append(dict(row))
    apply_efficiency(rows, single_samples_per_s, cfg["cores"])
    return rows


def best_single(baseline: list[dict], scaling_rows: list[dict]) -> dict | None:
    """The COST reference: the fastest one-process run, train_serial or ``psgd train`` with one
    allreduce rank (the same SGD in one process, through the trainer's loop)."""
    cands = [r for r in baseline if "error" not in r]
    cands += [r for r in scaling_rows if r.get("protocol") == "allreduce" and r.get("ranks") == 1
              and "error" not in r]
    return max(cands, key=lambda r: r["samples_per_s"], default=None)


def apply_efficiency(rows: list[dict], single_samples_per_s: float | None, cores: int) -> None:
    """Add speedup and per-core efficiency (against ``single_samples_per_s``) to scaling rows."""
    for row in rows:
        row["cores_used"] = min(row["workers"], cores)
        if "error" not in row and single_samples_per_s:
            row["speedup"] = row["samples_per_s"] / single_samples_per_s
            row["per_core_efficiency"] = row["speedup"] / row["cores_used"]


def single_process(data: str, model_spec: str, optimizer: str, lr: float, batch_size: int,
                   epochs: float, seed: int, eval_every_samples: int, eval_samples: int,
                   target: float) -> dict:
    """psgd.nn.serial.train_serial on the whole training set, evaluated every ``eval_every_samples``.

    The data is read into memory first (not timed); the first step's numba cache load
    is timed, as it is in ``psgd train``.  Training runs in chunks of
    ``eval_every_samples`` samples of one shuffled order per epoch, with one optimizer
    carried across chunks, so evaluation can happen between chunks; the clock runs
    across training and evaluation, as the lead worker's does in ``psgd train``.
    """
    import h5py
    import numpy as np

    from psgd.nn.model import CALIBRATION_SAMPLES, build_model
    from psgd.nn.optim import make_optimizer
    from psgd.nn.serial import train_serial
    with h5py.File(data, "r") as f:
        scale, offset = float(f.attrs["scale"]), float(f.attrs["offset"])
        x = f["train/x"][:].astype(np.float32) * scale + offset
        y = f["train/y"][:].astype(np.int64)
        xt = f["test/x"][:eval_samples].astype(np.float32) * scale + offset
        yt = f["test/y"][:eval_samples].astype(np.int64)
    model = build_model(model_spec, seed=seed, input_shape=x.shape[1:], n_classes=int(y.max()) + 1)
    model.set_calibration(x[:CALIBRATION_SAMPLES])
    opt = make_optimizer(optimizer, model.n_params)
    chunk = max(batch_size, eval_every_samples // batch_size * batch_size)
    total = int(round(epochs * len(x)))
    rng = np.random.default_rng(seed)
    evals, trained, train_s = [], 0, 0.0
    t_start = time.perf_counter()
    while trained < total:
        order = rng.permutation(len(x))[:total - trained]
        for s in range(0, len(order), chunk):
            idx = np.sort(order[s:s + chunk])
            t0 = time.perf_counter()
            train_serial(model, x[idx], y[idx], optimizer=opt, lr=lr, batch_size=batch_size,
                        epochs=1, seed=seed + trained, log=None)
            train_s += time.perf_counter() - t0
            trained += len(idx)
            _, acc = model.evaluate(xt, yt)
            evals.append((time.perf_counter() - t_start, float(acc)))
    wall = time.perf_counter() - t_start
    return {"name": "single process", "protocol": "local", "workers": 1, "servers": 0,
            "ranks": 1, "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
            "samples": trained, "wall_s": wall, "samples_per_s": trained / wall,
            "train_samples_per_s": trained / train_s, "final_accuracy": evals[-1][1],
            "time_to_target_s": time_to_target(evals, target), "evals": evals,
            "staleness_histogram": [], "staleness_mean": 0.0, "staleness_max": 0,
            "worker_time": {"compute_s": train_s, "push_s": 0.0, "pull_s": 0.0, "wait_s": 0.0,
                            "allreduce_s": 0.0}, "server_cpu_fraction": []}


def run_baseline(cfg: dict, out: Path, timeout: float, threads: str | None) -> dict:
    """single_process() in a fresh process, with ``threads`` BLAS threads (None: the default)."""
    env = dict(os.environ)
    for var in ONE_THREAD:
        env.pop(var, None)
        if threads is not None:
            env[var] = threads
    cmd = [sys.executable, str(Path(__file__).resolve()), "baseline", "--json", str(out),
           *[f"--{k.replace('_', '-')}={cfg[k]}" for k in
             ("data", "model", "optimizer", "lr", "batch_size", "epochs", "seed",
              "eval_every_samples", "eval_samples", "target_accuracy")]]
    try:
        proc = run_bounded(cmd, timeout, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        return {"name": "single process", "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"name": "single process", "error": f"exit {proc.returncode}: {proc.stderr[-400:]}"}
    row = json.loads(out.read_text())
    row["blas_threads"] = threads or "default"
    row["command"] = display_command(cmd, cfg["data"], out)
    print(f"  single process ({row['blas_threads']} BLAS threads): {row['samples_per_s']:.0f} "
          f"samples/s, final acc {row['final_accuracy']:.3f}, to target "
          f"{row['time_to_target_s']} s", flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["baseline"])
    ap.add_argument("--json", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="lenet")
    ap.add_argument("--optimizer", default="momentum")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every-samples", type=int, default=2560)
    ap.add_argument("--eval-samples", type=int, default=500)
    ap.add_argument("--target-accuracy", type=float, default=0.8)
    a = ap.parse_args()
    row = single_process(a.data, a.model, a.optimizer, a.lr, a.batch_size, a.epochs, a.seed,
                         a.eval_every_samples, a.eval_samples, a.target_accuracy)
    Path(a.json).write_text(json.dumps(row))


if __name__ == "__main__":
    main()
