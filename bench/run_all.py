"""`make bench`: every psgd benchmark, a protocol comparison and a scaling run, into one report.

    .venv/bin/python bench/run_all.py [--quick] [--out DIR | --publish]

Writes DIR/results.json, DIR/REPORT.md and PNG charts (DIR defaults to
runs/bench/all-TIME/; --publish: bench/results/).  The kernel, all-reduce, parameter-server and hogwild
benchmarks run as subprocesses through their --json outputs; the protocol
comparison, the single-process baseline and the scaling runs are in
bench/protocols.py, the report in bench/report.py.  --quick runs tiny versions
of everything (a few minutes at most; the numbers mean nothing) for the smoke test.
Every subprocess runs under a timeout; a failed part is recorded in the report
and makes the exit status non-zero.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import protocols  # noqa: E402
import report  # noqa: E402

# Settings of the protocol comparison (full, quick).
FULL = {"model": "lenet", "optimizer": "sgd", "lr": 0.1, "batch_size": 64, "epochs": 3, "seed": 0,
        "eval_every_samples": 1920, "eval_samples": 500, "target_accuracy": 0.80,
        "train": 12000, "test": 2000, "workers": (2, 3), "scaling_workers": (1, 2, 3, 4),
        "blas_check_epochs": 0.5}
QUICK = {"model": "lenet", "optimizer": "sgd", "lr": 0.1, "batch_size": 32, "epochs": 1, "seed": 0,
         "eval_every_samples": 128, "eval_samples": 100, "target_accuracy": 0.2,
         "train": 384, "test": 100, "workers": (2,), "scaling_workers": (1, 2),
         "blas_check_epochs": 1}
SCALING_PROTOCOLS = ("allreduce", "asp")


def machine() -> dict:
    """nproc, CPU model, memory and the versions that matter."""
    import h5py
    import mpi4py
    import numba
    import numpy
    from mpi4py import MPI
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal")), "0")
    try:
        import torch
        torch_v = torch.__version__
    except ImportError:
        torch_v = None
    return {"nproc": os.cpu_count(), "cpu": cpu, "memory_GB": round(int(mem) / 2 ** 20, 1),
            "os": platform.platform(), "python": platform.python_version(),
            "numpy": numpy.__version__, "numba": numba.__version__, "h5py": h5py.__version__,
            "mpi4py": mpi4py.__version__, "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "torch (for comparison)": torch_v}


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run_json(name: str, argv: list[str], timeout: float, tmp: Path):
    """Run ``bench/<script> argv --json TMP`` and return its JSON (or {'error': ...})."""
    out = tmp / f"{name}.json"
    cmd = [sys.executable, str(BENCH / argv[0]), *argv[1:], "--json", str(out)]
    print(f"[{name}] {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    try:
        proc = protocols.run_bounded(cmd, timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0 or not out.exists():
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-400:]}"}
    print(f"[{name}] done in {time.perf_counter() - t0:.0f} s", flush=True)
    return json.loads(out.read_text())


def micro_benchmarks(quick: bool, tmp: Path) -> dict:
    """The four existing benchmarks, tiny in quick mode."""
    if quick:
        argvs = {"kernels": ["bench_kernels.py", "--repeats", "2", "--seconds", "0.05", "--no-startup",
                               "--models", "mlp:784-256-256-10,lenet"],
                 "allreduce": ["bench_allreduce.py", "--ranks", "2", "--sizes", "4096,1048576",
                               "--seconds", "0.05"],
                 "ps": ["bench_ps.py", "--quick", "--n-params", "65536", "--server-counts", "1",
                        "--protocols", "asp,bsp"],
                 "hogwild": ["bench_hogwild.py", "--quick", "--n-params", "65536"]}
    else:
        argvs = {"kernels": ["bench_kernels.py"],
                 "allreduce": ["bench_allreduce.py", "--ranks", "2,4", "--seconds", "0.3"],
                 "ps": ["bench_ps.py"],
                 "hogwild": ["bench_hogwild.py"]}
    timeout = 120 if quick else 400
    sections = {}
    for name, argv in argvs.items():
        before = load()
        sections[name] = run_json(name, argv, timeout, tmp)
        if isinstance(sections[name], dict):
            sections[name]["load_average"] = [before, load()]
    if isinstance(sections["allreduce"], list):
        sections["allreduce"] = {"rows": sections["allreduce"]}
    hog, ps = sections["hogwild"], sections["ps"]
    if "error" not in hog and "error" not in ps:
        hog["asp"] = next((r for r in ps["ps"] if r["case"].startswith("asp S=1")), None)
        hog["asp_n_params"] = ps["n_params"]
    return sections


def protocol_benchmarks(s: dict, data: Path, logdir: Path, quick: bool, cores: int) -> tuple[dict, dict]:
    cfg = {k: s[k] for k in ("model", "optimizer", "lr", "batch_size", "epochs", "seed",
                             "eval_every_samples", "eval_samples", "target_accuracy")}
    cfg.update(data=str(data), cores=cores,
               dataset=f"psgd data synth --train {s['train']} --test {s['test']} (seed 0)")
    timeout = 120 if quick else 300
    print("[protocols] single-process baseline", flush=True)
    baseline = [protocols.run_baseline(cfg, logdir / "baseline1.json", timeout, "1"),
                protocols.run_baseline(dict(cfg, epochs=s["blas_check_epochs"]),
                                       logdir / "baseline_blas.json", timeout, str(cores))]
    baseline[1]["name"] = (f"single process, BLAS with {cores} threads "
                           f"({s['blas_check_epochs']} epochs)")
    print("[protocols] comparison", flush=True)
    runs = protocols.compare_protocols(cfg, s["workers"], logdir, timeout)
    single = next((b.get("samples_per_s") for b in baseline if b.get("blas_threads") == "1"), None)
    print("[scaling]", flush=True)
    rows = protocols.scaling(cfg, s["scaling_workers"], SCALING_PROTOCOLS, runs, logdir, timeout,
                             single)
    # the same asp run with BLAS at a thread per core in every rank (psgd's pin overridden)
    blas_cfg = dict(cfg, epochs=s["blas_check_epochs"])
    check = protocols.run_training(blas_cfg, "asp", "asp", 1, 2, [], logdir, timeout,
                                   env_extra={var: str(cores) for var in protocols.ONE_THREAD},
                                   tag="_blas")
    check["name"] = f"asp, BLAS with {cores} threads per rank ({s['blas_check_epochs']} epochs)"
    rows.append(check)
    ref = protocols.best_single(baseline, rows)        # COST reference: the fastest one process
    if ref is not None:
        single = ref["samples_per_s"]
    protocols.apply_efficiency(rows, single, cores)
    for r in baseline + runs + rows:
        r.pop("log", None)
    return ({"config": cfg, "baseline": baseline, "runs": runs},
            {"cores": cores, "single_samples_per_s": single,
             "single_reference": None if ref is None else f"{ref['name']} (W={ref['workers']}, "
                                                         f"{ref['blas_threads']} BLAS thread)",
             "rows": rows})


def caveats(quick: bool, cores: int) -> list[str]:
    out = []
    if quick:
        out.append("Quick mode: tiny dataset, few steps, small sizes. These numbers only show that "
                   "the pipeline works; do not read anything into them.")
    out += [
        f"This machine has {cores} cores. A parameter-server run with W workers has W + 1 ranks, "
        "so W = 2 already puts 3 ranks on 2 cores (the server sleeps while idle, but it still "
        "takes CPU for every push and pull); W >= 3 workers are oversubscribed whatever the protocol.",
        "Every training rank runs with OPENBLAS_NUM_THREADS=1 (and OMP/MKL = 1), which `psgd` "
        "sets itself unless the user sets them; the rows 'BLAS with N threads' override that "
        "with BLAS's own default of a thread per core, to show what the pin is worth.",
        "Time to target and wall time include the lead worker's periodic evaluation and the "
        "first-step numba cache load; the single-process baseline is timed the same way but "
        "without MPI start-up or HDF5 reads (its data is read into memory before the clock starts).",
        "BSP and all-reduce average the W gradients of a clock (one step with batch W x 64); SSP, "
        "ASP and hogwild apply every worker's gradient (W steps of batch 64 per clock). With the "
        "same learning rate they are therefore not the same optimizer; no per-protocol tuning was done.",
        "One run per configuration, no repeats: differences of ~10% are within run-to-run noise "
        "on a shared 2-core machine. Asynchronous runs are not deterministic.",
        "Samples/s is the lead worker's view: all workers' samples over the lead worker's wall time.",
        "COST reference: the faster of psgd.nn.serial.train_serial and `psgd train` with a single "
        "all-reduce rank (W=1, one process, no MPI traffic); the faster of the two (named in the "
        "scaling section) is the reference for speedups and per-core efficiency.",
        "Evaluation is not free: each evaluation of 500 test samples costs the lead worker about "
        "0.1 s. It is charged to every run alike (under BSP and all-reduce the other workers wait "
        "for it, under SSP/ASP/hogwild they do not).",
    ]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny versions of everything (smoke test)")
    common.add_output_arguments(ap)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: micro, protocols")
    ap.add_argument("--keep", action="store_true",
                    help="take the skipped parts from the results.json already in --out "
                         "(to rerun one part on a quieter machine)")
    args = ap.parse_args(argv)
    if args.keep and not (args.out or args.publish):
        ap.error("--keep takes the skipped parts from --out DIR's (or --publish's) results.json")
    out = common.out_dir(args, "all")
    skip = set(filter(None, args.skip.split(",")))
    s = QUICK if args.quick else FULL
    t0 = time.perf_counter()
    results = {"quick": args.quick, "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               "command": " ".join(["python bench/run_all.py", *(sys.argv[1:] if argv is None else argv)]),
               "load_before": load(), "machine": machine(), "sections": {}}
    cores = results["machine"]["nproc"] or 1
    if args.keep and (out / "results.json").exists():
        old = json.loads((out / "results.json").read_text())
        keep = {"micro": ("kernels", "allreduce", "ps", "hogwild"), "protocols": ("protocols", "scaling")}
        for part in skip:
            for key in keep.get(part, ()):
                if key in old["sections"]:
                    results["sections"][key] = old["sections"][key]
                    results["sections"][key]["kept_from"] = old["generated"]
    print(f"psgd bench: {'quick' if args.quick else 'full'} run into {out} "
          f"(load average {results['load_before']})", flush=True)
    with tempfile.TemporaryDirectory(prefix="psgd-bench-") as tmp:
        tmp = Path(tmp)
        if "micro" not in skip:
            results["sections"].update(micro_benchmarks(args.quick, tmp))
        if "protocols" not in skip:
            data = tmp / "synth.h5"
            protocols.run_bounded([sys.executable, "-m", "psgd", "data", "synth", "-o", str(data),
                                   "--train", str(s["train"]), "--test", str(s["test"])],
                                  120, cwd=ROOT).check_returncode()
            before = load()
            proto, scal = protocol_benchmarks(s, data, tmp, args.quick, cores)
            proto["load_average"] = scal["load_average"] = [before, load()]
            results["sections"]["protocols"] = proto
            results["sections"]["scaling"] = scal
            logs = out / "logs"
            shutil.rmtree(logs, ignore_errors=True)
            logs.mkdir()
            for log in tmp.glob("*.jsonl"):          # keep the training logs (small) for psgd plot
                shutil.copy(log, logs / log.name)
    results["load_after"] = load()
    results["total_s"] = time.perf_counter() - t0
    results["caveats"] = caveats(args.quick, cores)
    q = " --quick" if args.quick else ""
    results["reproduce"] = [
        "make install                       # .venv with psgd, MPICH from PyPI, numba, h5py, ...",
        ".venv/bin/pip install torch        # optional: the kernel comparison (CPU wheel)",
        f"make bench{'-quick' if args.quick else ''}                         "
        f"# = .venv/bin/python bench/run_all.py{q} (writes runs/bench/all-TIME/; "
        f"ARGS=--publish: bench/results/)",
        "# one distributed run of the comparison, by hand:",
        f".venv/bin/python -m psgd data synth -o synth.h5 --train {s['train']} --test {s['test']}",
        "OPENBLAS_NUM_THREADS=1 " + next((r["command"] for r in
                                           results["sections"].get("protocols", {}).get("runs", [])
                                           if "command" in r), "mpiexec -n 3 python -m psgd train ..."),
        ".venv/bin/python -m psgd plot bench/results/logs/*_w2.jsonl -o runs.png",
    ]
    failed = [k for k, v in results["sections"].items() if isinstance(v, dict) and "error" in v]
    for key in ("protocols", "scaling"):
        sec = results["sections"].get(key, {})
        for r in sec.get("runs", []) + sec.get("baseline", []) + sec.get("rows", []):
            if "error" in r:
                failed.append(f"{key}: {r['name']} W={r.get('workers')}")
    results["failed"] = failed
    data = (f"synthetic (psgd data synth --train {s['train']} --test {s['test']}) for the "
            f"training runs; {common.NO_DATA} for the micro-benchmarks")
    common.write_json(out / "results.json", results, data)
    path = report.write_report(results, out)
    common.write_text(path, path.read_text(), data)
    for chart in ("accuracy_vs_time.png", "time_split.png", "scaling.png"):
        if (out / chart).exists():
            common.stamp_png(out / chart, data)
    print(f"wrote {out / 'results.json'}, {path} and charts in {results['total_s']:.0f} s", flush=True)
    if failed:
        print("psgd bench: FAILED parts: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
