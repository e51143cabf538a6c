"""Pipeline parallelism measured: bubble against (K-1)/(M+K-1), 1f1b's memory against gpipe's,
throughput against data parallelism on the same ranks, pipedream's learning against gpipe's.

Run as ``python bench/bench_pipeline.py`` (``make bench-pipeline``): every row is one
``psgd train --pipeline`` (or ``--protocol allreduce``) run under mpiexec on synthetic data,
read back from its JSON-lines log.  The idle fraction of a stage is the time it waited on
its neighbours over its time, both from the second step on; "simulated" replays the
schedule with each stage's measured forward and backward time per microbatch
(psgd.pipeline.schedules.simulate).
Writes pipeline.json (and .md) into runs/bench/pipeline-TIME/ (``--publish``: bench/results/).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import common  # noqa: E402

BALANCED = "mlp:784-1024-1024-1024-1024-10"   # cut 2,3: two stages of about 1.9M parameters
FINE = "mlp:784" + "-1024" * 7 + "-10"         # 8 units: the auto cut can balance measured time
BIG = "mlp:784-4096-4096-4096-10"             # about 37M parameters


def train(data: Path, tmp: Path, ranks: int, name: str, *flags, prefix=()) -> dict:
    """One run (``prefix``: what runs mpiexec, e.g. ``psgd net``); its summary record."""
    log = tmp / f"{name}.jsonl"
    cmd = [*prefix, common.mpiexec(), "-n", str(ranks), sys.executable, "-m", "psgd", "train", "--quiet",
           "--data", str(data), "--log", str(log), "--overwrite", "--lr", "0.01", *map(str, flags)]
    proc = common.run_bounded(cmd, 600, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"bench-pipeline: {name} failed:\n{proc.stderr}")
    return next(json.loads(l) for l in log.read_text().splitlines() if '"summary"' in l)


# Two stages of equal work per microbatch at the cut 4,5 (in 1024x1024 matmul units: stage 0
# forward 0.77 + 3, backward 3 x 2 + 0.77, as the first layer computes no input gradient;
# stage 1 forward 3 + 0.5, backward twice that): FINE's best cut, 4,4, is 11 % off.
EVEN = "mlp:784" + "-1024" * 7 + "-512-10"
BUBBLE_ROWS = {   # name: model, cut, environment
    "even": (EVEN, "4,5", ()),
    "even-nospin": (EVEN, "4,5", ("PSGD_X_PIPELINE_SPIN_US=0",)),   # the waits sleep at once
    "auto": (FINE, "auto", ()),
}


def bubble_rows(data, tmp, steps, names="even", repeats=1):
    """K = 2, M = 1, 4, 8, 1f1b, kept activations (``--recompute off``): each of ``names``
    (:data:`BUBBLE_ROWS`) ``repeats`` times, the runs of one repeat in turn."""
    rows = []
    for rep in range(repeats):
        for name in names.split(","):
            model, cut, env = BUBBLE_ROWS[name]
            for m in (1, 4, 8):
                p = train(data, tmp, 2, f"bubble-{name}-m{m}", "--model", model, "--pipeline", 2,
                          "--partition", cut, "--microbatches", m, "--batch-size", 128,
                          "--steps", steps, "--recompute", "off", "--optimizer", "sgd",
                          prefix=("env", *env) if env else ())["pipeline"]
                rows.append({"K": 2, "M": m, "row": name, "repeat": rep, "model": model,
                             "cut": p["cut"], "recompute": "off", "env": list(env),
                             "formula": p["predicted_bubble"],
                             "simulated": p["simulated_idle"], "measured": p["idle"],
                             "measured_with_first_step": p["idle_with_first_step"],
                             "samples_per_s": p["samples_per_s"], "forward_s": p["forward_s"],
                             "backward_s": p["backward_s"]})
    return rows


def memory_rows(data, tmp, steps):
    rows = []
    for k in (2, 4):
        for schedule in ("gpipe", "1f1b"):
            p = train(data, tmp, k, f"memory-{k}-{schedule}", "--model", "lenet", "--pipeline", k,
                      "--microbatches", 8, "--batch-size", 64, "--schedule", schedule,
                      "--steps", steps)["pipeline"]
            rows.append({"K": k, "M": 8, "schedule": schedule, "microbatches_held": p["peak_microbatches"],
                         "activation_bytes": p["activation_bytes"]})
    return rows


RECOMPUTE_MODELS = {"mlp": (FINE, 256), "conv": ("lenet", 128)}   # model, batch


def recompute_rows(data, tmp, steps):
    """K = 2, auto cut, gpipe and 1f1b, M = 4 and 8, an MLP and lenet: --recompute on against
    off, each run's step time, every stage's peak resident memory and stored activation bytes."""
    rows = []
    for name, (model, batch) in RECOMPUTE_MODELS.items():
        for schedule in ("gpipe", "1f1b"):
            for m in (4, 8):
                for recompute in ("on", "off"):
                    p = train(data, tmp, 2, f"recompute-{name}-{schedule}-{m}-{recompute}",
                              "--model", model, "--pipeline", 2, "--microbatches", m,
                              "--batch-size", batch, "--schedule", schedule, "--steps", steps,
                              "--recompute", recompute, "--optimizer", "momentum")["pipeline"]
                    rows.append({"model": model, "batch": batch, "schedule": schedule, "M": m,
                                 "recompute": recompute, "cut": p["cut"],
                                 "step_ms": 1e3 * batch / p["samples_per_s"],
                                 "peak_rss_bytes": p["peak_rss_bytes"],
                                 "activation_bytes": p["activation_bytes"]})
    return rows


def recompute_markdown(rows: list) -> list[str]:
    mib = lambda xs: ", ".join(f"{x / 2**20:.1f}" for x in xs)  # noqa: E731
    out = ["## --recompute on against off (K = 2, auto cut, momentum)", "",
           "| model, batch | schedule | M | --recompute | cut | step ms | peak RSS MiB per stage | "
           "stored activations MiB per stage |", "|---|---|---|---|---|---|---|---|"]
    return out + [f"| {r['model']}, {r['batch']} | {r['schedule']} | {r['M']} | {r['recompute']} | "
                  f"{','.join(map(str, r['cut']))} | {r['step_ms']:.1f} | {mib(r['peak_rss_bytes'])} | "
                  f"{mib(r['activation_bytes'])} |" for r in rows]


def throughput_rows(data, tmp, steps):
    pipe = train(data, tmp, 2, "throughput-pipeline", "--model", BIG, "--pipeline", 2,
                 "--microbatches", 8, "--batch-size", 64, "--steps", steps, "--optimizer", "sgd")
    dp = train(data, tmp, 2, "throughput-allreduce", "--model", BIG, "--protocol", "allreduce",
               "--batch-size", 32, "--steps", steps, "--optimizer", "sgd")
    return [{"run": "pipeline K=2 M=8, batch 64", "samples_per_s": pipe["pipeline"]["samples_per_s"],
             "idle": pipe["pipeline"]["idle"]},
            {"run": "allreduce W=2, batch 32 each", "samples_per_s": dp["samples_per_s"]}]


def net_rows(data, tmp, steps, rates=("1gbit", "10gbit")):
    """The throughput pair on 2 emulated nodes (`psgd net`, one rank per node): a pipeline's
    stages exchange activations, data parallelism the whole gradient; beside each, `psgd plan
    --auto`'s prediction for the same plan on the same (shared) link."""
    rows = []
    for rate in rates:
        net = [sys.executable, "-m", "psgd", "net", "--nodes", "2", "--rate", rate, "--"]
        pipe = train(data, tmp, 2, f"net-{rate}-pipeline", "--model", BIG, "--pipeline", 2,
                     "--microbatches", 8, "--batch-size", 64, "--steps", steps, "--optimizer",
                     "sgd", prefix=net)
        dp = train(data, tmp, 2, f"net-{rate}-allreduce", "--model", BIG, "--protocol", "allreduce",
                   "--batch-size", 32, "--steps", steps, "--optimizer", "sgd", prefix=net)
        cut = pipe["pipeline"]["cut"]
        rows.append({"rate": rate, "pipeline": pipe["pipeline"]["samples_per_s"],
                     "idle": pipe["pipeline"]["idle"], "allreduce": dp["samples_per_s"],
                     "cut": cut, "plan_pipeline": planned(tmp, rate, 64, pipeline_of(cut)),
                     "plan_allreduce": planned(tmp, rate, 32, allreduce_of)})
    return rows


def pipeline_of(cut):
    """The plan of the measured pipeline: 1 x 2 stages, 1f1b, M = 8, its cut (if planned)."""
    return lambda p: (p["kind"] == "pipeline" and p["replicas"] == 1 and p["stages"] == 2 and
                      p["microbatches"] == 8 and p["schedule"] == "1f1b", p["partition"] == cut)


def allreduce_of(p):
    """The plan of the measured data parallelism: psgd's ring all-reduce over W = 2."""
    return p["plan"] == "allreduce ring W=2 S=0", True


def planned(tmp, rate, batch, match) -> dict | None:
    """`psgd plan --auto`'s plan that ``match`` picks (the same cut first), on BIG, 2 ranks,
    sgd, ``batch`` per replica, both nodes on one ``rate`` link (as `psgd net` emulates)."""
    cmd = [sys.executable, "-m", "psgd", "plan", "--auto", "--model", BIG, "--ranks", "2",
           "--memory-per-rank", "16G", "--bandwidth", rate, "--shared-link", "--batch-size",
           str(batch), "--optimizer", "sgd", "--json", "--top", "1000",
           "--profile", str(tmp / "big-profile.json")]
    proc = common.run_bounded(cmd, 600, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"bench-pipeline: psgd plan failed:\n{proc.stderr}")
    plans = [p for p in json.loads(proc.stdout)["plans"] if match(p)[0]]
    best = sorted(plans, key=lambda p: (not match(p)[1], p["step_s"]))
    return {k: best[0][k] for k in ("plan", "samples_per_s", "bubble", "partition")} if best else None


# the models of the cut measurement: model, batch, microbatches
CUT_MODELS = {"lenet": ("lenet", 32, 4), "resnet8": ("resnet8", 32, 4), "mlp": (FINE, 64, 4),
              "mlp5": (BALANCED, 64, 4)}   # 5 units: 6 cuts at K = 3


def compositions(n: int, k: int) -> list[list[int]]:
    """Every cut of ``n`` units into ``k`` non-empty contiguous stages, as unit counts."""
    if k == 1:
        return [[n]]
    return [[c, *rest] for c in range(1, n - k + 2) for rest in compositions(n - c, k - 1)]


def partition_rows(data, tmp, steps, name="lenet", k=2, rounds=3, cache=None, budget=None,
                   start=None):
    """One model of :data:`CUT_MODELS` on ``k`` stages: the auto cut's samples/s (from the
    second step on, so the first step's one-off costs stay out) against every
    cut's, ``rounds`` rounds, each an auto run and then every cut once, in an order rotated
    by one a round (so no cut always runs first, after the same neighbour).

    Each run is kept as a line of ``cache`` (a .jsonl file; rounds found there are not run
    again); ``budget`` (s since ``start``): start no round that the last one's time says
    would end after it."""
    model, batch, m = CUT_MODELS[name]
    flags = ["--model", model, "--pipeline", k, "--microbatches", m, "--batch-size", batch,
             "--steps", steps]
    runs = [json.loads(l) for l in cache.read_text().splitlines()] if cache and cache.exists() else []
    for r in range(rounds):
        if any(x["round"] == r for x in runs):
            continue
        took = max((x.get("round_s", 0.0) for x in runs), default=0.0)   # a round's seconds
        if budget and time.monotonic() - start + took > budget:
            print(f"bench-pipeline: --budget reached, {name} K={k} has {r} of {rounds} rounds; "
                  f"run again with the same --out to add them", flush=True)
            break
        t = time.monotonic()
        auto = train(data, tmp, k, f"cut-{name}-auto", *flags)["pipeline"]
        cuts = compositions(sum(auto["cut"]), k)
        rate = lambda p: p["measured_samples_per_s"]  # noqa: E731  (from the second step on)
        new = [{"round": r, "cut": auto["cut"], "auto": True, "samples_per_s": rate(auto)}]
        for i in range(len(cuts)):
            cut = cuts[(i + r) % len(cuts)]
            p = train(data, tmp, k, f"cut-{name}-{i}", *flags,
                      "--partition", ",".join(map(str, cut)))["pipeline"]
            new.append({"round": r, "cut": p["cut"], "auto": False, "samples_per_s": rate(p)})
        new[0]["round_s"] = time.monotonic() - t
        runs += new
        if cache:
            with cache.open("a") as f:
                f.writelines(json.dumps(x) + "\n" for x in new)
    return {"model": model, "name": name, "K": k, "batch": batch, "M": m, "steps": steps,
            "runs": runs}


def cut_summary(res: dict) -> dict:
    """Each cut's median samples/s over its rounds, the best cut's, and the auto cut's: the
    cut the auto runs chose most often (its median over the fixed-cut runs of that cut, so
    the auto runs' profiling does not enter), and the auto runs' own median."""
    med = lambda xs: float(np.median(xs))  # noqa: E731
    fixed: dict = {}
    for x in res["runs"]:
        if not x["auto"]:
            fixed.setdefault(tuple(x["cut"]), []).append(x["samples_per_s"])
    autos = [x for x in res["runs"] if x["auto"]]
    chosen = [tuple(x["cut"]) for x in autos]
    auto_cut = max(dict.fromkeys(chosen), key=chosen.count) if chosen else None
    medians = {c: med(v) for c, v in fixed.items()}
    best = max(medians, key=medians.get) if medians else None
    return {"medians": medians, "best": best, "auto_cut": auto_cut, "auto_cuts": chosen,
            "auto_runs_median": med([x["samples_per_s"] for x in autos]) if autos else None,
            "rounds": min(map(len, fixed.values())) if fixed else 0,
            "ratio": medians[auto_cut] / medians[best] if auto_cut in medians else None}


def cut_markdown(results: list) -> list[str]:
    """One summary table over the models, then each model's cuts."""
    cut = lambda c: ",".join(map(str, c))  # noqa: E731
    out = ["## The auto cut against every cut (median samples/s over interleaved rounds)", "",
           "| model | K | batch, M | rounds | auto cut (chosen per round) | its median | best cut | "
           "its median | auto / best | auto runs' own median |", "|---|---|---|---|---|---|---|---|---|---|"]
    sums = [(res, cut_summary(res)) for res in results]
    for res, s in sums:
        if s["best"] is None:
            continue
        out.append(f"| {res['name']} | {res['K']} | {res['batch']}, {res['M']} | {s['rounds']} | "
                   f"{cut(s['auto_cut'])} ({'; '.join(map(cut, s['auto_cuts']))}) | "
                   f"{s['medians'][s['auto_cut']]:.0f} | {cut(s['best'])} | {s['medians'][s['best']]:.0f} | "
                   f"{s['ratio']:.3f} | {s['auto_runs_median']:.0f} |")
    for res, s in sums:
        out += ["", f"### {res['name']} ({res['model']}), K = {res['K']}", "",
                "| cut | samples/s per round | median | of the best median |", "|---|---|---|---|"]
        for c, v in sorted(s["medians"].items(), key=lambda cv: -cv[1]):
            per = [x["samples_per_s"] for x in sorted(res["runs"], key=lambda x: x["round"])
                   if not x["auto"] and tuple(x["cut"]) == c]
            out.append(f"| {cut(c)}{' (auto)' if c == s['auto_cut'] else ''} | "
                       f"{', '.join(f'{p:.0f}' for p in per)} | {v:.0f} | {v / s['medians'][s['best']]:.3f} |")
    return out


LEARN_RUNS = {   # the asynchronous schedules step every microbatch: lr / M, the same rate per sample
    "gpipe": ["--schedule", "gpipe"], "1f1b": ["--schedule", "1f1b"],
    "pipedream": ["--schedule", "pipedream"],
    "pipedream-vertical": ["--schedule", "pipedream", "--vertical-sync"],
    "pipedream-nostash": ["--schedule", "pipedream", "--weight-stashing", "off"],
    "pipemare": ["--schedule", "pipemare"],
    "pipemare-plain": ["--schedule", "pipemare", "--pipemare-anneal", 0,
                       "--discrepancy-correction", "off"],
    "pipemare-noanneal": ["--schedule", "pipemare", "--pipemare-anneal", 0],
    "pipemare-nocorrect": ["--schedule", "pipemare", "--discrepancy-correction", "off"],
    # psgd's staleness compensation on each stage's steps (--stage-comp) instead of, or on
    # top of, PipeMare's corrections
    "pipedream-dcasgd": ["--schedule", "pipedream", "--stage-comp", "dcasgd"],
    "pipemare-plain-inverse": ["--schedule", "pipemare", "--pipemare-anneal", 0,
                               "--discrepancy-correction", "off", "--stage-comp", "inverse"],
    "pipemare-plain-amom": ["--schedule", "pipemare", "--pipemare-anneal", 0,
                            "--discrepancy-correction", "off", "--stage-comp", "amom"],
    "pipemare-dcasgd": ["--schedule", "pipemare", "--stage-comp", "dcasgd"],
    "allreduce": [],   # data parallelism on the same K ranks, batch 32 / K each (equal samples)
}


def learning_rows(data, tmp, args, out: Path):
    """The schedules of ``args.rows`` on equal samples, ``args.seeds`` seeds each, for each K of
    ``args.learn_stages``, M = 4, ``args.learn_model``, momentum; test accuracy on ``args.eval_samples`` rows.

    Each run's result is kept in ``out/learning-runs/`` and not run again, so a comparison can
    be split over several runs of this script; ``args.budget`` (s) stops starting runs."""
    m, lr, start = 4, args.learn_lr, time.monotonic()
    cache = out / "learning-runs"
    cache.mkdir(exist_ok=True)
    rows, left = [], 0
    for k in map(int, str(args.learn_stages).split(",")):
        for name in args.rows.split(","):
            flags = LEARN_RUNS[name]
            rate = lr / m if flags and flags[1] in ("pipedream", "pipemare") else lr
            mode = ["--protocol", "allreduce", "--batch-size", args.learn_batch // k] \
                if name == "allreduce" else \
                ["--pipeline", k, "--microbatches", m, "--batch-size", args.learn_batch,
                 *(["--partition", args.learn_partition] if args.learn_partition else [])]
            cut = f"-cut{args.learn_partition.replace(',', '.')}" if args.learn_partition else ""
            acc = []
            for seed in range(args.seeds):
                model = "" if args.learn_model == "lenet" else f"{args.learn_model}-"
                key = cache / (f"{model}{name}-k{k}{cut}-b{args.learn_batch}-lr{lr:g}-"
                               f"{args.learn_schedule}-{args.learn_steps}-e{args.eval_samples}-"
                               f"seed{seed}.json")
                if not key.exists():
                    if args.budget and time.monotonic() - start > args.budget:
                        left += 1
                        continue
                    summary = train(data, tmp, k, f"learn-{name}-{seed}", "--model", args.learn_model,
                                    *mode, "--steps", args.learn_steps, "--seed", seed,
                                    "--optimizer", "momentum", "--eval-samples",
                                    args.eval_samples, "--lr-schedule", args.learn_schedule,
                                    *flags, "--lr", rate)
                    key.write_text(json.dumps({"test_accuracy": summary["test_accuracy"],
                                               "test_loss": summary["test_loss"],
                                               "cut": (summary.get("pipeline") or {}).get("cut")}))
                acc.append(json.loads(key.read_text())["test_accuracy"])
            rows.append({"schedule": name, "K": k, "lr": rate, "steps": args.learn_steps,
                         "model": args.learn_model,
                         "partition": args.learn_partition or "auto",
                         "batch": args.learn_batch, "lr_schedule": args.learn_schedule,
                         "test_accuracy": acc})
    if left:
        print(f"bench-pipeline: --budget reached, {left} learning runs left; run again with "
              f"the same --out to add them", flush=True)
    return rows


def bubble_markdown(rows: list) -> list[str]:
    """One line per row name and M: each stage's range over the repeats."""
    rng = lambda xs, fmt="{:.3f}": (fmt.format(min(xs)) if min(xs) == max(xs) else  # noqa: E731
                                    f"{fmt.format(min(xs))}-{fmt.format(max(xs))}")
    per = lambda rs, key, scale=1.0, fmt="{:.3f}": ", ".join(  # noqa: E731
        rng([scale * r[key][i] for r in rs], fmt) for i in range(len(rs[0][key])))
    out = ["## Bubble (K = 2, 1f1b, --recompute off, batch 128, sgd; per stage, the range over "
           "the repeats)", "",
           "| row | model, cut | M | runs | (K-1)/(M+K-1) | measured idle | within +-0.05 | "
           "simulated | idle with the first step | forward ms | backward ms | samples/s |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for r in rows:
        groups.setdefault((r.get("row", "-"), r["M"]), []).append(r)
    for (name, m), rs in groups.items():
        r0 = rs[0]
        ok = all(abs(x - r["formula"]) <= 0.05 for r in rs for x in r["measured"])
        out.append(f"| {name} | {r0['model']}, {','.join(map(str, r0['cut']))} | {m} | {len(rs)} | "
                   f"{r0['formula']:.3f} | {per(rs, 'measured')} | {'yes' if ok else 'no'} | "
                   f"{per(rs, 'simulated')} | "
                   f"{per(rs, 'measured_with_first_step') if 'measured_with_first_step' in r0 else '-'} | "
                   f"{per(rs, 'forward_s', 1e3, '{:.2f}')} | {per(rs, 'backward_s', 1e3, '{:.2f}')} | "
                   f"{rng([r['samples_per_s'] for r in rs], '{:.0f}')} |")
    return out


def markdown(res: dict) -> str:
    f = lambda xs: ", ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    out = bubble_markdown(res["bubble"])
    out += ["", "## Stored activations (lenet, M = 8)", "",
            "| K | schedule | microbatches held per stage | peak activation bytes per stage |",
            "|---|---|---|---|"]
    out += [f"| {r['K']} | {r['schedule']} | {r['microbatches_held']} | "
            f"{[int(b) for b in r['activation_bytes']]} |" for r in res["memory"]]
    out += ["", f"## Throughput ({BIG}, 2 ranks, global batch 64)", "",
            "| run | samples/s |", "|---|---|"]
    out += [f"| {r['run']} | {r['samples_per_s']:.1f} |" for r in res["throughput"]]
    out += ["", *cut_markdown([res["partition"]])]
    return "\n".join(out) + "\n"


def part_markdown(part: str, rows: list) -> str:
    """The table of ``--only bubble``, ``--only recompute`` or ``--only net``."""
    if part in ("bubble", "recompute"):
        table = bubble_markdown if part == "bubble" else recompute_markdown
        return "\n".join(table(rows)) + "\n"
    out = ["## Throughput on 2 emulated nodes (mlp:784-4096-4096-4096-10, 37M parameters, sgd)",
           "", "| link | pipeline K=2 M=8, batch 64: samples/s (cut) | psgd plan (its cut) | "
           "measured / plan | idle per stage | allreduce W=2, batch 32 each: samples/s | "
           "psgd plan | measured / plan | pipeline / allreduce |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        pp, pa = r.get("plan_pipeline") or {}, r.get("plan_allreduce") or {}
        ratio = lambda m, p: f"{m / p['samples_per_s']:.2f}" if p else "-"  # noqa: E731
        pred = lambda p: (f"{p['samples_per_s']:.1f}" + (f" ({','.join(map(str, p['partition']))})"  # noqa: E731
                                                          if p.get("partition") else "")) if p else "-"
        out.append(f"| {r['rate']} | {r['pipeline']:.1f} ({','.join(map(str, r.get('cut', [])))}) | "
                   f"{pred(pp)} | {ratio(r['pipeline'], pp)} | "
                   f"{', '.join(f'{f:.3f}' for f in r['idle'])} | {r['allreduce']:.1f} | {pred(pa)} | "
                   f"{ratio(r['allreduce'], pa)} | {r['pipeline'] / r['allreduce']:.2f} |")
    return "\n".join(out) + "\n"


def learning_markdown(res: dict) -> str:
    """One table per K: each seed's accuracy and its difference from gpipe's on that seed."""
    out = []
    for k in dict.fromkeys(r["K"] for r in res["learning"]):
        rows = [r for r in res["learning"] if r["K"] == k]
        base = next((r["test_accuracy"] for r in rows if r["schedule"] == "gpipe"), [])
        r0 = rows[0]
        out += [f"## Learning ({r0.get('model', 'lenet')}, K = {k}, cut {r0.get('partition', 'auto')}, M = 4, "
                f"batch {r0['batch']}, momentum, "
                f"{r0['lr_schedule']} lr, {r0['steps']} steps, equal samples)", "",
                "| schedule | lr | test accuracy per seed | mean | minus gpipe per seed (points) | "
                "largest |difference| |", "|---|---|---|---|---|---|"]
        for r in rows:
            acc = r["test_accuracy"]
            diff = [100 * (a - b) for a, b in zip(acc, base)]
            mean = f"{sum(acc) / len(acc):.3f}" if acc else "-"
            out.append(f"| {r['schedule']} | {r['lr']:g} | {', '.join(f'{a:.3f}' for a in acc)} | "
                       f"{mean} | {', '.join(f'{d:+.1f}' for d in diff)} | "
                       f"{max(map(abs, diff)) if diff else 0:.1f} |")
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="steps per bubble/memory run (default 30)")
    ap.add_argument("--bubble-rows", default="even",
                    help=f"bubble rows, comma-separated, of {', '.join(BUBBLE_ROWS)} (default even)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each bubble row (default 1)")
    ap.add_argument("--big-steps", type=int, default=6, help="steps per throughput run (default 6)")
    ap.add_argument("--learn-steps", type=int, default=150, help="steps per learning run (default 150)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per learning row (default 2)")
    ap.add_argument("--learn-model", default="lenet", help="model of the learning rows (default lenet)")
    ap.add_argument("--learn-stages", default="2", help="K of the learning rows, comma-separated "
                    "(default 2)")
    ap.add_argument("--learn-batch", type=int, default=32, help="batch of the learning rows (default 32)")
    ap.add_argument("--learn-lr", type=float, default=0.05,
                    help="gpipe's learning rate; the asynchronous rows step lr / M (default 0.05)")
    ap.add_argument("--learn-schedule", default="constant",
                    help="--lr-schedule of the learning rows (default constant)")
    ap.add_argument("--learn-partition", default=None, metavar="CUT",
                    help="--partition of the learning rows (one K; default auto)")
    ap.add_argument("--budget", type=float, default=None, metavar="S",
                    help="start no learning run (or cut round) after S seconds (each run's result is kept "
                         "under --out; run again with the same --out to add the rest)")
    ap.add_argument("--rows", default="gpipe,pipedream,pipedream-vertical,pipedream-nostash",
                    help=f"learning rows, comma-separated, of {', '.join(LEARN_RUNS)}")
    ap.add_argument("--eval-samples", type=int, default=2000,
                    help="test rows each learning run evaluates (default 2000)")
    ap.add_argument("--fashion", action="store_true",
                    help="Fashion-MNIST instead of synthetic data (when installed)")
    ap.add_argument("--cut-models", default="lenet",
                    help=f"models of the cut measurement, comma-separated, of {', '.join(CUT_MODELS)} "
                         "(default lenet)")
    ap.add_argument("--cut-stages", default="2", help="K of the cut measurement, comma-separated "
                    "(default 2)")
    ap.add_argument("--cut-rounds", type=int, default=3,
                    help="rounds of the cut measurement: each an auto run and every cut once (default 3)")
    ap.add_argument("--only", choices=("timing", "learning", "bubble", "recompute", "net", "cut"),
                    default=None,
                    help="run one part: timing (bubble, memory, throughput, cut), learning, "
                         "bubble alone, cut (the auto cut against every cut, --cut-models and "
                         "--cut-stages), recompute (step time and memory, on against off), or net "
                         "(the throughput pair on `psgd net` at 1 and 10 Gbit/s; needs root) (each "
                         "writes its own result files)")
    common.add_output_arguments(ap)
    args = ap.parse_args()
    unknown = set(args.rows.split(",")) - set(LEARN_RUNS)
    if unknown:
        ap.error(f"--rows: unknown {', '.join(sorted(unknown))}; choose from {', '.join(LEARN_RUNS)}")
    unknown = set(args.cut_models.split(",")) - set(CUT_MODELS)
    if unknown:
        ap.error(f"--cut-models: unknown {', '.join(sorted(unknown))}; choose from {', '.join(CUT_MODELS)}")
    unknown = set(args.bubble_rows.split(",")) - set(BUBBLE_ROWS)
    if unknown:
        ap.error(f"--bubble-rows: unknown {', '.join(sorted(unknown))}; choose from {', '.join(BUBBLE_ROWS)}")
    out = common.out_dir(args, "pipeline")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        data = common.dataset(tmp, not args.fashion, "bench-pipeline", train=4096)
        if args.only in ("bubble", "recompute", "net"):
            rows = {"bubble": lambda: bubble_rows(data.path, tmp, args.steps, args.bubble_rows,
                                                  args.repeats),
                    "recompute": lambda: recompute_rows(data.path, tmp, args.steps),
                    "net": lambda: net_rows(data.path, tmp, args.big_steps)}[args.only]()
            _write(out, f"pipeline-{args.only}", {args.only: rows}, part_markdown(args.only, rows),
                   data.name, not args.fashion)
        elif args.only == "cut":
            rows = cut_part(data.path, tmp, args, out)
            _write(out, "pipeline-cut", {"cut": rows}, "\n".join(cut_markdown(rows)) + "\n",
                   data.name, not args.fashion)
        elif args.only != "learning":
            res = {"bubble": bubble_rows(data.path, tmp, args.steps),
                   "memory": memory_rows(data.path, tmp, args.steps),
                   "throughput": throughput_rows(data.path, tmp, args.big_steps),
                   "partition": partition_rows(data.path, tmp, args.steps, rounds=args.cut_rounds)}
            _write(out, "pipeline", res, markdown(res), data.name, not args.fashion)
        if args.only in (None, "learning"):
            res = {"learning": learning_rows(data.path, tmp, args, out)}
            base = "pipeline-learning" + (f"-k{args.learn_stages.replace(',', '')}"
                                          if args.learn_stages != "2" else "")
            _write(out, base, res, learning_markdown(res), data.name, not args.fashion)


def cut_part(data, tmp, args, out: Path) -> list:
    """``--only cut``: every model of ``args.cut_models`` at every K of ``args.cut_stages``,
    round by round over them, each run kept under ``out/cut-runs/``."""
    start, runs = time.monotonic(), out / "cut-runs"
    runs.mkdir(exist_ok=True)
    todo = [(name, k) for name in args.cut_models.split(",") for k in map(int, args.cut_stages.split(","))]
    rows = []
    for r in range(1, args.cut_rounds + 1):   # round by round over the models
        rows = [partition_rows(data, tmp, args.steps, name, k, r,
                               runs / f"{name}-k{k}-s{args.steps}.jsonl", args.budget, start)
                for name, k in todo]
    return rows


def _write(out: Path, base: str, res: dict, text: str, data: str, quick: bool) -> None:
    stem = common.result_stem(base, quick)
    common.write_json(out / f"{stem}.json", res, data)
    common.write_text(out / f"{stem}.md", text, data)
    print(text)


if __name__ == "__main__":
    main()
