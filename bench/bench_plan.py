"""`make bench-plan`: the plans `psgd plan --auto` keeps, run, against its predictions.

    .venv/bin/python bench/bench_plan.py [--ranks 2] [--seconds 3] [--top 3] [--publish]
    .venv/bin/python bench/bench_plan.py --net 1gbit,10gbit --ranks 2,4 [--publish]

For each case (a model and a memory budget per rank: two small MLPs and LeNet, then the
issue's 40M-parameter MLP and a wide one) the search runs on a profile made here
(``--profiles DIR``: kept there and reused); its top plans, the fastest plan of each kind
(data-parallel, pipeline, tensor, spatial, grid), the fastest data plan of serial SGD's
arithmetic and the fastest pipeline of stages split by rows (D x K x P) run through ``mpiexec -n RANKS python -m psgd train`` with the printed flags on
the same synthetic data. Reported per plan: predicted and measured samples per second
(measured: a data plan's last half of the steps, a tensor grid's median step, a
pipeline's whole run, its first step included) and their ratio, the plan's bytes per rank
and the run's peak resident set (a tensor grid's every rank, a pipeline's part 0 of each
stage); per case: whether the top plan's prediction is within 25 % and whether the top
plan is within 10 % of the fastest measured. At 4 ranks and more a case whose cap only
pipelines of tensor-split stages fit, and the CIFAR preset on 3x32x32 images, are added. The search's wall time at 8-1024 ranks is
measured on a ResNet-20 profile and each case's. Writes plan-synthetic.{json,md} into
runs/bench/plan-TIME/ (--publish: bench/results/ and docs/results/plan.md).

With ``--net RATES`` every run goes through ``psgd net --nodes 2 --rate RATE`` (rank r on
emulated node r mod 2, one shared link) and the search plans for that placement and link,
at each rank count of ``--ranks`` (a comma list here); the cases are the CIFAR preset and
an MLP on 3x32x32 images, then the two big MLPs on 28x28 ones, and a table of the plans the
search picks at 64-1024 ranks (predicted only) follows. Writes plan-net-synthetic.* and
docs/results/plan-net.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")       # the profile times one BLAS thread, as a rank runs

import common  # noqa: E402
from common import ROOT, mpiexec, run_bounded  # noqa: E402

from psgd.plan.auto import arithmetic, get_profile  # noqa: E402
from psgd.plan.cost import Network  # noqa: E402
from psgd.plan.inputs import parse_bandwidth, train_bytes  # noqa: E402
from psgd.plan.search import Budget, search  # noqa: E402

# (model, memory per rank beyond the process's base and the training data): a budget every
# plan fits, and one below data parallelism's need
CASES = [("mlp:784-512-512-10", 1 << 30), ("mlp:784-512-512-10", 5 << 20), ("lenet", 1 << 30)]
# at 4 ranks and more, on 3x32x32 images: the 2-wide layer keeps every split at T <= 2, and a
# 3072x2048 layer's 25 MB (three copies: weights, gradient, the all-reduce's) does not fit
# whole, so only pipelines of tensor-split stages (D x K x T) fit the cap
SPLIT_CASE = ("mlp:3072-2048-2048-2-10", 48 << 20)
# at 4 ranks and more, the CIFAR preset on 3x32x32 images: pipelines of stages split by rows
# (D x K x P) are among its plans
SPATIAL_CASE = ("cifar-cnn", 1 << 30)
# the big models on 28x28 images, on shared memory and on psgd net: a 40M-parameter MLP
# (37M) and a wide one (74M, 294 MB of float32; data parallelism's three copies fit 1 GB)
BIG_CASES = [("mlp:784-4096-4096-4096-10", 1 << 30), ("mlp:784-8192-8192-10", 1 << 30)]
# the search's wall time: rank counts, and runs of each up to 256 ranks (the range is printed;
# one run at 1024)
SEARCH_RANKS = (8, 64, 256, 1024)
SEARCH_REPEATS = 3
NET_CASES = [("cifar-cnn", 1 << 30), ("mlp:3072-1024-1024-10", 1 << 30)]
# the extrapolation: models by size, networks, rank counts (predicted only)
PAPER_MODELS = ("cifar-cnn", "resnet20", "mlp:3072-4096-4096-4096-10")
PAPER_NETS = ("1gbit", "10gbit", "100gbit")
PAPER_RANKS = (64, 256, 1024)


def steps_for(plan, args) -> int:
    """Enough steps for about ``--seconds`` of predicted training (the first step's start-up
    then weighs little), at least ``--steps``."""
    per_step = plan.replicas * plan.batch / plan.samples_per_s
    return int(min(3000, max(args.steps, args.seconds / per_step)))


def measured_rate(plan, data: Path, model: str, args, log: Path) -> tuple[float, int | None]:
    """Samples per second of the run: a data plan's lead over the second half of the steps
    (its last record: records at ceil(steps / 2) and at the end, no evaluation between),
    a tensor grid's median step, a pipeline's whole run; and the largest peak resident set
    the run's summary gives (a tensor grid's every rank, a pipeline's part 0 of each stage;
    None for a data plan)."""
    steps = steps_for(plan, args)
    net = [sys.executable, "-m", "psgd", "net", "--nodes", "2", "--rate", args.rate, "--"] \
        if args.rate else []
    cmd = [*net, mpiexec(), "-n", str(plan.ranks), sys.executable, "-m", "psgd", "train", "--data",
           str(data), "--model", model, *plan.train_args(), "--steps", str(steps),
           "--log-every", str(steps - steps // 2), "--quiet", "--log", str(log),
           "--eval-samples", "64", *(["--eval-every", "0"] if plan.kind == "data" else [])]
    proc = run_bounded(cmd, args.timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"bench-plan: {plan.label()} failed: {proc.stderr.strip()[-400:]}")
    records = [json.loads(x) for x in log.read_text().splitlines()]
    s = [r for r in records if r["kind"] == "summary"][-1]
    rss = max(s.get("pipeline", s).get("peak_rss_bytes", []), default=None)
    if "pipeline" in s:
        return s["pipeline"]["samples_per_s"], rss
    if "step_ms" in s:
        return plan.replicas * plan.batch / s["step_ms"] * 1e3, rss
    return [r for r in records if r["kind"] == "step"][-1]["est_global_samples_per_s"], rss


def chosen(plans: list, top: int) -> list:
    """The top plans, then the fastest of each kind not among them, the fastest data plan
    whose arithmetic is serial SGD's (a lossy or asynchronous one may lead the kind), and the
    fastest pipeline of stages split by rows (D x K x P)."""
    picked = plans[:top]
    for kind in ("data", "pipeline", "tensor", "spatial", "grid", "exact data", "pipeline spatial"):
        pure = next((p for p in plans if p.kind == kind.split()[0 if kind == "pipeline spatial" else -1]
                     and (p.sync or kind != "exact data")
                     and (p.axis == "spatial" or kind != "pipeline spatial")), None)
        if pure is not None and pure not in picked:
            picked.append(pure)
    return picked


def run_case(case: int, model: str, memory: int, data: Path, tmp: Path, args) -> dict:
    prof = get_profile(model, str(Path(args.profiles or tmp) / f"{model.replace(':', '_')}.json"),
                       data=str(data))
    held = prof.base_bytes + train_bytes(str(data))     # the process and, at most, all the data
    plans, _ = search(prof, bench_budget(args, held + memory, data))
    print(json.dumps({"model": model, "crowd_ratios": prof.crowd_ratios, "mac_s": prof.mac_s,
                      "load": os.getloadavg()}), flush=True)
    rows = []
    for plan in chosen(plans, args.top):
        log = tmp / f"{case}-{args.rate}-{args.ranks}-{len(rows)}.jsonl"
        rate, rss = measured_rate(plan, data, model, args, log)
        rows.append({"rank": plans.index(plan) + 1, "plan": plan.label(), "sync": plan.sync,
                     "arithmetic": arithmetic(plan),
                     "predicted": round(plan.samples_per_s, 1), "measured": round(rate, 1),
                     "ratio": round(rate / plan.samples_per_s, 3),
                     "memory_mb": round(plan.memory / 2**20, 2),
                     "peak_rss_mb": None if rss is None else round(rss / 2**20, 2)})
        print(json.dumps(rows[-1]), flush=True)
    top, best = rows[0], max(r["measured"] for r in rows)
    return {"model": model, "memory": memory, "rows": rows, "kept": len(plans),
            "crowd_ratios": prof.crowd_ratios, "budget_mb": round((held + memory) / 2**20, 2),
            "search_s": search_times(prof),
            "top_within_25": abs(top["ratio"] - 1) <= 0.25,
            "top_within_10_of_best": top["measured"] >= 0.9 * best}


def colour_data(tmp: Path) -> Path:
    """3x32x32 synthetic images (4096 to train on) in ``tmp``."""
    path = tmp / "colour.h5"
    run_bounded([sys.executable, "-m", "psgd", "data", "synth", "--channels", "3", "--train",
                 "4096", "--test", "256", "-o", str(path)], 300, cwd=ROOT).check_returncode()
    return path


def bench_budget(args, memory: int, data: Path) -> Budget:
    """The budget of a run on this machine: shared memory (``--per-node``), or ``psgd net``'s
    two nodes (rank r on node r mod 2) behind one shared link of ``args.rate``; the ranks
    share the machine's cores, and copies within a node run at ``--bandwidth``."""
    data_bytes = train_bytes(str(data))
    shm = args.bandwidth / 8          # this machine's shared memory, within a node
    if args.rate:
        net = Network(parse_bandwidth(args.rate), 50e-6, shared=True, shm_bandwidth=shm)
        return Budget(args.ranks, memory, net, args.per_node, args.batch_size,
                      data_bytes=data_bytes, cliques=2, cores=os.cpu_count())
    return Budget(args.ranks, memory, Network(shm, shm_bandwidth=shm), args.per_node,
                  args.batch_size, data_bytes=data_bytes, cores=os.cpu_count())


def paper_table(tmp: Path) -> str:
    """The fastest plan the search finds for each model, network and rank count, and the
    fastest whose arithmetic is serial SGD's (1 GB per rank, one rank per core, 8 ranks per
    node): predicted, never run."""
    lines = ["| model | MB params | network | ranks | fastest plan | arithmetic | samples/s "
             "| fastest `= serial` plan | samples/s | search s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for model in PAPER_MODELS:
        prof = get_profile(model, str(tmp / f"{model.replace(':', '_')}.json"))
        for rate in PAPER_NETS:
            for ranks in PAPER_RANKS:
                start = time.perf_counter()
                plans, _ = search(prof, Budget(ranks, 1 << 30, Network(parse_bandwidth(rate)),
                                               per_node=8, batch=64))
                took = time.perf_counter() - start
                top, exact = plans[0], next(p for p in plans if p.sync)
                lines.append(f"| {model} | {prof.param_bytes / 2**20:.1f} | {rate} | {ranks} | "
                             f"{top.label()} | {arithmetic(top)} | {top.samples_per_s:.0f} | "
                             f"{exact.label()} | {exact.samples_per_s:.0f} | {took:.2f} |")
    return "\n".join(lines)


def search_times(prof) -> dict:
    """Wall seconds of the search on ``prof`` at each of :data:`SEARCH_RANKS` (1 GB per rank,
    10 Gbit/s, 8 ranks a node, batch 64), [fastest, slowest] of :data:`SEARCH_REPEATS` runs
    (one at more than 256 ranks)."""
    out = {}
    for ranks in SEARCH_RANKS:
        took = []
        for _ in range(SEARCH_REPEATS if ranks <= 256 else 1):
            start = time.perf_counter()
            search(prof, Budget(ranks, 1 << 30, Network(1.25e9), per_node=8, batch=64))
            took.append(time.perf_counter() - start)
        out[ranks] = [round(min(took), 3), round(max(took), 3)]
    return out


def quick_profile(model: str):
    """``model``'s profile with one short crowd round per ratio: for the search's time only
    (its values do not change the work the search does)."""
    saved = {k: os.environ.get(k) for k in ("PSGD_X_CROWD_SECONDS", "PSGD_X_CROWD_REPEATS")}
    os.environ.update(PSGD_X_CROWD_SECONDS="0.01", PSGD_X_CROWD_REPEATS="1")
    try:
        return get_profile(model, None)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.update({k: v})


def search_table(times: dict) -> str:
    """Each profile's search seconds by rank count (fastest-slowest of the runs), and the
    issue's bar on ResNet-20: under 1 s at 8 ranks, under 10 s at 64."""
    head = "| model | " + " | ".join(f"{r} ranks" for r in SEARCH_RANKS) + " |"
    lines = [f"Search wall time, seconds (fastest-slowest of {SEARCH_REPEATS} runs, one at 1024 ranks; 1 GB per rank, "
             f"10 Gbit/s, 8 ranks a node, batch 64):", "", head,
             "|---|" + "---|" * len(SEARCH_RANKS)]
    lines += [f"| {m} | " + " | ".join(f"{lo:.2f}-{hi:.2f}" for lo, hi in t.values()) + " |"
              for m, t in times.items()]
    r = times.get("resnet20")
    if r:
        lines += ["", f"ResNet-20: under 1 s at 8 ranks: {'yes' if r[8][1] < 1 else 'no'}; "
                      f"under 10 s at 64 ranks: {'yes' if r[64][1] < 10 else 'no'}."]
    return "\n".join(lines)


def where(args) -> str:
    if args.rate:
        return (f"on `psgd net --nodes 2 --rate {args.rate}` (rank r on node r mod 2, one shared "
                f"link), planned for that link")
    return f"on shared memory, planned for {args.bandwidth / 1e9:g} Gbit/s"


def table(cases: list, args) -> str:
    over = f" (oversubscribed: {args.ranks} ranks on {os.cpu_count()} cores)" \
        if args.ranks > (os.cpu_count() or 1) else ""
    lines = [f"{args.ranks} ranks{over} {where(args)}, batch {args.batch_size} per "
             f"replica, at least {args.steps} steps and about {args.seconds:g} s per run.", ""]
    for c in cases:
        lines += [f"**{c['model']}**, {c['memory'] / 2**20:.0f} MB per rank beyond the process "
                  f"and the training data ({c.get('budget_mb', 0):.0f} MB in all): {c['kept']} plans "
                  f"fit; top prediction within 25 %: {'yes' if c['top_within_25'] else 'no'}; "
                  f"top within 10 % of the best measured: "
                  f"{'yes' if c['top_within_10_of_best'] else 'no'}", "",
                  "| # | plan | arithmetic | MB/rank | peak RSS MB | predicted samples/s | measured "
                  "| measured/predicted |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['rank']} | {r['plan']} | {r['arithmetic']} | {r['memory_mb']} | "
                  f"{'-' if r.get('peak_rss_mb') is None else r['peak_rss_mb']} | "
                  f"{r['predicted']:.0f} | {r['measured']:.0f} | {r['ratio']:.2f} |"
                  for r in c["rows"]]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=lambda t: [int(n) for n in t.split(",")], default=[2],
                    help="ranks per run (default 2); with --net a comma list, e.g. 2,4")
    ap.add_argument("--steps", type=int, default=30, help="at least (default 30)")
    ap.add_argument("--seconds", type=float, default=3.0, help="predicted seconds per run")
    ap.add_argument("--top", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--bandwidth", type=float, default=80e9,
                    help="bits/s of this machine's shared memory (copies within a node)")
    ap.add_argument("--per-node", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--cases", type=lambda t: [int(n) for n in t.split(",")], default=None,
                    help="only these cases (0-based; without --net: CASES, BIG_CASES, then at 4 "
                         "ranks and more the D x K x T case and cifar-cnn; with --net: NET_CASES, "
                         "BIG_CASES)")
    ap.add_argument("--net-cases", action="store_true",
                    help="without --net: run NET_CASES (the CIFAR preset and an MLP, on 3x32x32 "
                         "images) on shared memory instead of the cases above")
    ap.add_argument("--no-resnet20", action="store_true",
                    help="without --net: skip the ResNet-20 profile and its search times")
    ap.add_argument("--no-paper", action="store_true",
                    help="with --net: skip the 64-1024-rank table (its profiles)")
    ap.add_argument("--profiles", default=None, metavar="DIR",
                    help="keep each model's profile in DIR and reuse it (default: made per run)")
    ap.add_argument("--net", default=None, metavar="RATES",
                    help="e.g. 1gbit,10gbit: run on psgd net's 2 nodes at each rate")
    common.add_output_arguments(ap)
    args = ap.parse_args()
    if args.profiles:
        Path(args.profiles).mkdir(parents=True, exist_ok=True)
    if args.net:
        return main_net(args)
    if len(args.ranks) != 1:
        raise SystemExit("bench-plan: --ranks takes one count without --net")
    args.rate, args.ranks = None, args.ranks[0]
    out = common.out_dir(args, "plan")
    times = {} if args.no_resnet20 else {"resnet20": search_times(quick_profile("resnet20"))}
    print(json.dumps({"search_s": times}), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = common.dataset(Path(tmp), True, "bench-plan", train=4096)
        todo = [(m, mem, data.path) for m, mem in CASES + BIG_CASES]
        if args.net_cases:
            colour = colour_data(Path(tmp))
            todo = [(m, mem, colour) for m, mem in NET_CASES]
        elif args.ranks >= 4:       # D x K x T and D x K x P need K x T >= 4 ranks
            colour = colour_data(Path(tmp))
            todo += [(*SPLIT_CASE, colour), (*SPATIAL_CASE, colour)]
        picked = range(len(todo)) if args.cases is None else args.cases
        cases = [run_case(i, m, mem, path, Path(tmp), args)
                 for i, (m, mem, path) in enumerate(todo) if i in picked]
    times.update((c["model"], c["search_s"]) for c in cases)
    stem = common.result_stem("plan", True)
    body = table(cases, args) + "\n" + search_table(times)
    files = [common.write_json(out / f"{stem}.json", {"cases": cases, "search_s": times}, data.name),
             common.write_text(out / f"{stem}.md", body, data.name)]
    print(body)
    if args.publish:
        common.docs_page("plan", "Plans: predicted against measured",
                         "The plans `psgd plan --auto` keeps, run on this machine, against its "
                         "predictions (`make bench-plan`).", body, files)


def main_net(args) -> None:
    """The --net bench: NET_CASES at each rate on 3x32x32 synthetic images and BIG_CASES on
    28x28 ones (``--cases``: some of them), then the extrapolation table."""
    out, parts, results = common.out_dir(args, "plan-net"), [], {}
    counts = args.ranks
    with tempfile.TemporaryDirectory() as tmp:
        data = colour_data(Path(tmp))
        todo = [(m, mem, data) for m, mem in NET_CASES]
        grey = common.dataset(Path(tmp), True, "bench-plan", train=4096).path
        todo += [(m, mem, grey) for m, mem in BIG_CASES]
        picked = range(len(todo)) if args.cases is None else args.cases
        for ranks in counts:
            for rate in args.net.split(","):
                args.ranks, args.rate = ranks, rate
                cases = [run_case(i, m, mem, path, Path(tmp), args)
                         for i, (m, mem, path) in enumerate(todo) if i in picked]
                results[f"{rate}, {args.ranks} ranks"] = cases
                parts += [f"## {rate}, {args.ranks} ranks", "", table(cases, args)]
        paper = None if args.no_paper else paper_table(Path(tmp))
    if paper:
        parts += ["## 64 to 1024 ranks: predicted only, never run", "",
                  "The fastest plan the search finds, and the fastest whose arithmetic is serial "
                  "SGD's, at 1 GB per rank, 8 ranks per node, batch 64 per replica, from profiles "
                  "made on this machine (one rank per core assumed; nothing here was measured at "
                  "these sizes).", "", paper]
    body = "\n".join(parts)
    stem = common.result_stem("plan-net", True)
    files = [common.write_json(out / f"{stem}.json", {"rates": results}, common.SYNTHETIC),
             common.write_text(out / f"{stem}.md", body, common.SYNTHETIC)]
    print(body)
    if args.publish:
        common.docs_page("plan-net", "Plans on an emulated network, and at 64-1024 ranks",
                         "The plans `psgd plan --auto` keeps, run on `psgd net` at two rates "
                         "(`make bench-plan ARGS=--net ...`), and the plans it picks for large "
                         "jobs, predicted only.", body, files)


if __name__ == "__main__":
    main()
