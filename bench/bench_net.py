"""Measured against predicted throughput of the protocols on emulated nodes (``make bench-net``).

Each row is one ``psgd net --nodes K --rate R -- mpiexec -n 4 python -m psgd train``
run (bsp, ssp, asp and hogwild with 1 server + 3 workers, allreduce with 4 workers), its
throughput taken from the lead's step records after the first third of the
steps; the prediction is :func:`psgd.plan.cost.predict` for the same placement
on one shared link, fed the compute time per sample and the link's bandwidth
measured here in the same run (a 4 MB ping-pong between two emulated nodes).
Then the bus bandwidth of the hierarchical all-reduce, psgd's flat ring and
MPI_Allreduce at 2 nodes x 2 ranks (bench/bench_allreduce.py under psgd net).
Needs root (psgd net); writes net.{md,json} into runs/bench/net-TIME/ (--publish:
bench/results/net.*).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")       # one BLAS thread per rank, as psgd's CLI sets

import common  # noqa: E402
from psgd.plan.command import measure_compute_s  # noqa: E402
from psgd.plan.cost import Job, Network, predict  # noqa: E402

PY = sys.executable
DATA = "synthetic (psgd data synth, its default sizes)"
MODELS = {"lenet": "lenet", "mlp2m": "mlp:784-1536-512-10"}
# (protocol, S, model row)
RUNS = [("bsp", 1, "bsp"), ("ssp", 1, "ssp"), ("asp", 1, "asp"), ("hogwild", 1, "hogwild"),
        ("allreduce", 0, None)]
RANKS, BATCH = 4, 64
PINGPONG = """
import time, numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD; b = np.zeros(1 << 20, np.float32); best = 1e9
for _ in range(5):
    c.Barrier(); t = time.perf_counter()
    for _ in range(4):
        if c.rank == 0: c.Send(b, 1); c.Recv(b, 1)
        else: c.Recv(b, 0); c.Send(b, 0)
    best = min(best, time.perf_counter() - t)
if c.rank == 0: print(8 * b.nbytes / best)
"""


def net(nodes: int, rate: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "psgd", "net", "--nodes", str(nodes), "--rate", rate, "--",
                           *argv], cwd=ROOT, text=True, capture_output=True, **kw)


def link_bandwidth(rate: str) -> float:
    """Bytes/s of a 4 MB ping-pong between two emulated nodes (the best of five)."""
    proc = net(2, rate, [common.mpiexec(), "-n", "2", PY, "-c", PINGPONG], check=True, timeout=120)
    return float(proc.stdout.split()[-1])


def measured(log: Path, workers: int) -> tuple[float, float]:
    """Samples/s of all workers and the lead's compute seconds per sample, after the first third."""
    steps = [r for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == "step"]
    i = len(steps) // 3
    first, last = steps[i], steps[-1]
    done = last["step"] - first["step"]
    compute = sum(r["compute_s"] for r in steps[i + 1:]) / (done * BATCH)
    return done * BATCH * workers / (last["time"] - first["time"]), compute


def run_row(data: str, model: str, protocol: str, servers: int, nodes: int, rate: str,
            steps: int, tmp: Path) -> tuple[float, float]:
    log = tmp / f"{model}-{protocol}-{nodes}-{rate}.jsonl"
    cmd = [common.mpiexec(), "-n", str(RANKS), PY, "-m", "psgd", "train", "--data", data, "--model",
           MODELS[model], "--protocol", protocol, "--servers", str(servers), "--steps",
           str(steps), "--batch-size", str(BATCH), "--log-every", "3", "--eval-every", "0",
           "--eval-samples", "200", "--log", str(log), "--quiet"]
    proc = net(nodes, rate, cmd, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"bench_net: {model} {protocol} K={nodes} {rate} failed:\n{proc.stderr}")
    return measured(log, RANKS - servers)


def predicted_throughput(model_row: str | None, n_params: int, compute_s: float, servers: int,
                         nodes: int, bandwidth: float, cores: int | None) -> tuple[str, float]:
    job = Job(n_params, compute_s, BATCH, RANKS - servers, servers, cliques=nodes, cores=cores)
    p = predict(job, Network(bandwidth, 50e-6, shared=True))
    name = model_row or ("allreduce hierarchical" if nodes < RANKS else "allreduce ring")
    return name, p[name]["samples_per_s"]


def bus_bandwidth(rate: str, seconds: float) -> list[dict]:
    """bench_allreduce at 2 nodes x 2 ranks: psgd forced to its flat ring, p2p = auto
    (the hierarchical all-reduce), MPI_Allreduce; and MPI's flat composition alone."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, env in (("", {}), ("flat", {"MPIR_CVAR_ALLREDUCE_COMPOSITION": "2"})):
            out = Path(tmp) / f"{label}.json"
            proc = net(2, rate, [PY, "bench/bench_allreduce.py", "--ranks", "4", "--algorithm",
                                 "ring", "--sizes", "1048576,4194304,16777216", "--seconds",
                                 str(seconds), "--json", str(out)], env={**os.environ, **env},
                       timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"bench_net: bench_allreduce at {rate} failed:\n{proc.stderr}")
            for r in json.loads(out.read_text())["rows"]:
                rows.append({"rate": rate, "mpi_composition": label or "auto", **r})
    return rows


def markdown(rows: list[dict], bus: list[dict], links: dict, compute: dict) -> str:
    lines = ["# bench-net: measured against predicted throughput on emulated nodes", "",
             f"4 ranks on {os.cpu_count()} cores; batch {BATCH}; compute per sample measured "
             "here: " + ", ".join(f"{m} {c * 1e6:.0f} us" for m, c in compute.items()) +
             "; link (4 MB ping-pong): " + ", ".join(f"{r} {b / 1e6:.0f} MB/s"
                                                     for r, b in links.items()), "",
             "*predicted*: compute measured alone (one rank), slowed by workers/cores; *from the "
             "run's compute*: the lead worker's compute time per sample in that run.", "",
             "| model | rate | nodes | protocol | model row | measured samples/s | predicted | "
             "pred/meas | run's compute us | predicted from it | pred/meas |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['rate']} | {r['nodes']} | {r['protocol']} | "
                     f"{r['model_row']} | {r['measured']:.0f} | {r['predicted']:.0f} | "
                     f"{r['predicted'] / r['measured']:.2f} | {r['compute_in_run_s'] * 1e6:.0f} | "
                     f"{r['predicted_in_run']:.0f} | {r['predicted_in_run'] / r['measured']:.2f} |")
    lines += ["", "## All-reduce bus bandwidth, 2 nodes x 2 ranks (GB/s; 2(N-1)/N x bytes / time)",
              "", "| rate | size | hierarchical (psgd auto) | psgd flat ring | MPI_Allreduce | "
              "hierarchical / MPI | MPI composition |", "|---|---|---|---|---|---|---|"]
    for r in bus:
        lines.append(f"| {r['rate']} | {r['bytes'] >> 20} MB | {r['p2p_busbw_GBs']:.3f} | "
                     f"{r['psgd_busbw_GBs']:.3f} | {r['mpi_busbw_GBs']:.3f} | "
                     f"{r['mpi_s'] / r['p2p_s']:.2f} | {r['mpi_composition']} |")
    return "\n".join(lines) + "\n"


def write(out: str, rows: list[dict], bus: list[dict], links: dict, compute: dict) -> None:
    text = markdown(rows, bus, links, compute)
    print(text)
    common.write_text(Path(out + ".md"), text, DATA)
    common.write_json(Path(out + ".json"),
                      {"rows": rows, "bus_bandwidth": bus, "link_bytes_per_s": links,
                       "compute_s_per_sample": compute}, DATA)
    print(f"wrote {out}.md, {out}.json")


def repredict(out: str) -> None:
    """Predict OUT.json's rows again with the model as it is now (measurements unchanged)."""
    from psgd.nn.model import build_model
    saved = json.loads(Path(out + ".json").read_text())
    links, compute = saved["link_bytes_per_s"], saved["compute_s_per_sample"]
    for row in saved["rows"]:
        model_row = dict((p, r) for p, _, r in RUNS)[row["protocol"]]
        n_params = build_model(MODELS[row["model"]]).n_params
        args = (row["servers"], row["nodes"], links[row["rate"]])
        row["model_row"], row["predicted"] = predicted_throughput(
            model_row, n_params, compute[row["model"]], *args, os.cpu_count())
        row["predicted_in_run"] = predicted_throughput(model_row, n_params,
                                                       row["compute_in_run_s"], *args, None)[1]
    write(out, saved["rows"], saved["bus_bandwidth"], links, compute)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1gbit,10gbit")
    ap.add_argument("--nodes", default="2,4")
    ap.add_argument("--models", default="lenet,mlp2m")
    ap.add_argument("--protocols", default=",".join(r[0] for r in RUNS),
                    help="which of the rows' protocols to run")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=0.3, help="bench_allreduce's per size")
    common.add_output_arguments(ap)
    ap.add_argument("--repredict", action="store_true",
                    help="recompute the predictions of net.json in --out (or --publish's); "
                         "run nothing")
    args = ap.parse_args()
    if args.repredict and not (args.out or args.publish):
        ap.error("--repredict reads net.json from --out DIR or --publish's bench/results/")
    args.out = str(common.out_dir(args, "net") / "net")   # before the runs, not after them
    if args.repredict:
        repredict(args.out)
        return
    rates, models = args.rates.split(","), args.models.split(",")
    runs = [r for r in RUNS if r[0] in args.protocols.split(",")]
    unknown = set(args.protocols.split(",")) - {r[0] for r in RUNS}
    if unknown:
        ap.error(f"--protocols: {', '.join(sorted(unknown))} not among "
                 f"{', '.join(r[0] for r in RUNS)}")
    from psgd.nn.model import build_model
    compute = {m: measure_compute_s(MODELS[m], BATCH) for m in models}
    links = {r: link_bandwidth(r) for r in rates}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = str(Path(tmp) / "synth.h5")
        subprocess.run([PY, "-m", "psgd", "data", "synth", "-o", data], check=True,
                       capture_output=True)
        for model in models:
            n_params = build_model(MODELS[model]).n_params
            for rate in rates:
                for nodes in map(int, args.nodes.split(",")):
                    for protocol, servers, model_row in runs:
                        got, in_run = run_row(data, model, protocol, servers, nodes, rate,
                                              args.steps, Path(tmp))
                        at = (servers, nodes, links[rate])
                        name, predicted = predicted_throughput(model_row, n_params,
                                                               compute[model], *at, os.cpu_count())
                        row = {"model": model, "rate": rate, "nodes": nodes,
                               "protocol": protocol, "servers": servers, "model_row": name,
                               "measured": got, "predicted": predicted,
                               "compute_in_run_s": in_run, "predicted_in_run":
                               predicted_throughput(model_row, n_params, in_run, *at, None)[1]}
                        rows.append(row)
                        print(f"{model:6} {rate:6} K={nodes} {protocol:9} measured {got:7.0f} "
                              f" predicted {predicted:7.0f} ({predicted / got:.2f}), from the "
                              f"run's compute {row['predicted_in_run']:7.0f} "
                              f"({row['predicted_in_run'] / got:.2f}) samples/s", flush=True)
    bus = [r for rate in rates for r in bus_bandwidth(rate, args.seconds)]
    write(args.out, rows, bus, links, compute)


if __name__ == "__main__":
    main()
