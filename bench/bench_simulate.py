"""`make bench-simulate`: psgd simulate's speed, its validation against real runs, and its table.

    .venv/bin/python bench/bench_simulate.py [--quick] [--out DIR | --publish]

1. Speed: the event loop alone at 1,024 workers x about 100,000 updates (asp
   on 4 servers, and bsp), wall seconds; SimPy's on the same model at a tenth
   of the updates, side by side, when SimPy imports (``SIMPY_PATH`` may name
   a folder that holds it; it is no dependency of psgd).
2. Validation: real ``mpiexec`` runs (``--model``, default the MLP) at W = 2,
   4, 8 (``--widths``) under bsp, ssp s=2, asp, hogwild, gossip and adpsgd
   (``--protocols``), without and with
   ``--straggler W-1:slow=3``, 3 seeds each (``--seeds``), 600 steps under
   ``--lr-schedule cosine`` (the length at which real runs repeat), each with
   ``--timeline``; the simulator takes each worker's times between steps from
   the run's timeline, in order (a straggler's sleeps included: on two shared
   cores they also free a core for the others, which drawing the spec anew
   would miss), each message's latency drawn from half the pulls' round trips
   the run measured (``--latency-from``; gossip: each exchange from its step spans);
   compared: updates/s over the
   training loop, the staleness histogram's total-variation distance, and the
   final test accuracy of the real run against the simulator's training along
   its order at the same seed (means over seeds). ``--keep`` keeps the real runs,
   ``--from`` simulates kept ones again, ``--real-only`` runs them without
   simulating, and ``--repeat-from`` reports each real run's TV from its own
   repetition (the same cell and seed, kept elsewhere) beside the simulator's.
3. The table: W = 16, 64, 256, 1024 (``--table-widths``) of ``--table-model``, predicted
   updates/s and staleness for bsp, ssp s=2 and asp (with and without compensation), and up
   to W = 256 (``--table-train-upto``) the accuracy of training along the simulated order
   (``--train``, ``--table-epochs``).

Writes simulate.json and simulate.md into runs/bench/simulate-TIME/ (--publish:
bench/results/).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import common  # noqa: E402

import numpy as np  # noqa: E402

PROTOCOLS = {"bsp": ["--protocol", "bsp"], "ssp s=2": ["--protocol", "ssp", "--staleness", "2"],
             "asp": ["--protocol", "asp"]}
VALIDATED = {**PROTOCOLS, "hogwild": ["--protocol", "hogwild"],
             "gossip": ["--protocol", "gossip", "--servers", "0"],
             "adpsgd": ["--protocol", "adpsgd", "--servers", "0"]}
DRAWN = {"gossip"}   # its exchanges drawn from the run's step spans (no pulls to read)
COMP = {"none": ["--staleness-comp", "none"], "dana": ["--staleness-comp", "dana"]}
TRAIN = ["--optimizer", "momentum", "--lr", "0.05", "--skip-nonfinite"]


def psgd(*argv, timeout=600, ranks=None) -> str:
    cmd = [sys.executable, "-m", "psgd", *map(str, argv)]
    if ranks:
        cmd = [common.mpiexec(), "-n", str(ranks), *cmd]
    proc = common.run_bounded(cmd, timeout, cwd=common.ROOT)
    if proc.returncode:
        raise SystemExit(f"bench-simulate: {' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    return proc.stdout


def simulate(tmp: Path, *argv) -> dict:
    out = tmp / "sim.json"
    psgd("simulate", *argv, "--json", out)
    return json.loads(out.read_text())


# ---- 1. speed ---------------------------------------------------------------------------

def _loop(protocol: str, W: int, T: int, S: int, n_params: int = 61_706):
    from psgd.plan.cost import Job, Network
    from psgd.protocols import get
    from psgd.simulate.compute import compute_times
    from psgd.simulate.events import simulate as run_loop
    from psgd.simulate.links import Links
    from psgd.simulate.rules import rules_for
    times = compute_times([0.02], W, T, jitter="lognormal:0.5")
    job, net = Job(n_params, 0.02 / 64, 64, W, S), Network(1.25e9)
    rules = rules_for(get(protocol), None, job, net)
    t0 = time.perf_counter()
    sch = run_loop(rules, times, S, Links(job, net))
    return time.perf_counter() - t0, sch, rules, times


def _simpy_asp(simpy, times: np.ndarray, rules, latency: float = 20e-6) -> float:
    """The same asp model in SimPy on one server: compute, push, the server's step, the reply."""
    env = simpy.Environment()
    server = simpy.Resource(env, capacity=1)
    wire = rules.push_bytes / 1.25e9

    def worker(w):
        for c in range(times.shape[1]):
            yield env.timeout(times[w, c])
            yield env.timeout(wire + latency)
            with server.request() as req:
                yield req
                yield env.timeout(rules.push_s)
            yield env.timeout(wire + latency)

    for w in range(times.shape[0]):
        env.process(worker(w))
    t0 = time.perf_counter()
    env.run()
    return time.perf_counter() - t0


def speed(quick: bool) -> dict:
    W, T = 1024, 10 if quick else 98
    out = {}
    for protocol, S in (("asp", 4), ("bsp", 4), ("asp", 1)):
        wall, sch, _, _ = _loop(protocol, W, T, S)
        out[f"{protocol} S={S}"] = {"workers": W, "updates": sch.updates, "wall_s": wall,
                                    "events": int(len(sch.order))}
        print(f"speed: {protocol} W={W} S={S}: {sch.updates} updates in {wall:.1f} s", flush=True)
    if os.environ.get("SIMPY_PATH"):
        sys.path.insert(0, os.environ["SIMPY_PATH"])
    try:
        import simpy
    except ImportError:
        out["simpy"] = "not installed"
        return out
    wall, sch, rules, times = _loop("asp", W, max(2, T // 10), 1)
    simpy_s = _simpy_asp(simpy, times, rules)
    out["simpy"] = {"version": simpy.__version__, "workers": W, "updates": sch.updates,
                    "simpy_wall_s": simpy_s, "heap_wall_s": wall}
    print(f"speed: SimPy {simpy.__version__} {simpy_s:.2f} s, the heap {wall:.2f} s "
          f"({sch.updates} updates, one server)", flush=True)
    return out


# ---- 2. validation against real runs ------------------------------------------------------

def _trace(path: Path) -> dict:
    """(pid, name) -> [(ts, dur)], the workers' clocks set to the server's."""
    from psgd.simulate.clocks import worker_offsets
    events = json.loads(path.read_text())["traceEvents"]
    shift = worker_offsets(events)
    spans: dict = {}
    for e in events:
        if e.get("ph") == "X":
            spans.setdefault((e["pid"], e["name"]), []).append(
                (e["ts"] + shift.get(e["pid"], 0.0), e["dur"]))
    return spans


def real_rate(spans: dict) -> float:
    """Updates/s over the training loop: the steps after each worker's first, over the time
    from the first worker's first step to the last worker's last (as the simulator counts)."""
    runs = [sorted(v) for (pid, name), v in spans.items() if name == "step" and len(v) > 2]
    start = min(r[0][0] + r[0][1] for r in runs)
    end = max(r[-1][0] + r[-1][1] for r in runs)
    return sum(len(r) - 1 for r in runs) / ((end - start) * 1e-6)


def pull_us(spans: dict) -> float:
    """The median time a pull's transfer took (after the servers answered), microseconds (nan:
    none, a run without servers): on ranks that share two cores, mostly waiting for a core.
    Where there are pulls the simulator draws each message's latency from half of each."""
    found = [d for (pid, name), v in spans.items() if name == "pull" for _, d in v[1:]]
    return float(np.median(found)) if found else float("nan")


def _schedule(opts) -> list:
    """The validation's learning-rate schedule flags (none: psgd's default)."""
    return ["--lr-schedule", opts.lr_schedule] if opts.lr_schedule else []


def _real(tmp: Path, data: Path, W: int, proto: str, slow: bool, opts, seed: int) -> tuple:
    name = _name(W, proto, slow, seed)
    tl, log = tmp / f"{name}.json", tmp / f"{name}.jsonl"
    extra = ["--straggler", f"{W - 1}:slow=3"] if slow else []
    psgd("train", "--data", data, "--model", opts.model, "--batch-size", 32,
         "--steps", opts.steps, "--seed", seed, *VALIDATED[proto], *extra, *_schedule(opts),
         "--timeline", tl, "--log", log, "--quiet",
         ranks=W + _servers(proto))
    summary = [json.loads(line) for line in log.read_text().splitlines()][-1]
    return tl, summary


def _servers(proto: str) -> int:
    from psgd.protocols import get
    return 1 if get(VALIDATED[proto][1]).servers else 0


def _tv(real: list, sim: list) -> float | None:
    """The staleness histograms' distance; None where the protocol has none (gossip)."""
    from psgd.simulate.stats import tv_distance
    return tv_distance(real, sim) if sum(real) and sum(sim) else None


def _name(W: int, proto: str, slow: bool, seed: int) -> str:
    return f"{proto.replace(' ', '').replace('=', '')}-w{W}{'-slow' if slow else ''}-s{seed}"


def _saved(folder: Path, W: int, proto: str, slow: bool, seed: int) -> tuple:
    """A real run kept by ``--keep``: its timeline and its log's summary."""
    name = _name(W, proto, slow, seed)
    tl, log = folder / f"{name}.json", folder / f"{name}.jsonl"
    if not tl.exists():
        raise SystemExit(f"bench-simulate: --from {folder}: no {tl.name}")
    return tl, [json.loads(line) for line in log.read_text().splitlines()][-1]


def _pair(tmp: Path, data: Path, W: int, proto: str, slow: bool, opts, seed: int) -> dict:
    """One real run (or one kept, ``--from``) and its simulation (trained along, at the same
    seed), compared; ``--keep``: the run's timeline, log and this row stay in that folder."""
    if opts.source:
        tl, summary = _saved(opts.source, W, proto, slow, seed)
    else:
        tl, summary = _real(opts.keep or tmp, data, W, proto, slow, opts, seed)
    spans = _trace(tl)
    pulls = pull_us(spans)
    argv = ["--workers", W, "--model", opts.model, "--batch-size", 32, "--steps", opts.steps,
            "--seed", seed, *VALIDATED[proto], *_schedule(opts), "--compute-from", tl,
            "--per-node", W + _servers(proto), "--data", data, "--train"]
    latency = ["--latency-from", tl] if proto in DRAWN or not math.isnan(pulls) else []
    sim = simulate(tmp, *argv, *latency)
    real = real_rate(spans)
    row = {"W": W, "protocol": proto, "straggler": slow, "seed": seed, "model": opts.model,
           "steps": opts.steps, "lr_schedule": opts.lr_schedule, "real_updates_per_s": real,
           "sim_updates_per_s": sim["steady_updates_per_s"],
           "ratio": sim["steady_updates_per_s"] / real,
           "real_step_ms": W / real * 1e3, "sim_step_ms": W / sim["steady_updates_per_s"] * 1e3,
           "tv": _tv(summary["staleness_histogram"], sim["staleness"]["histogram"]),
           "real_acc": summary["test_accuracy"], "sim_acc": sim["training"]["test_acc"],
           "real_staleness": summary["staleness_histogram"],
           "sim_staleness": sim["staleness"]["histogram"]}
    if opts.repeat and (opts.repeat / f"{_name(W, proto, slow, seed)}.json").exists():
        again = _saved(opts.repeat, W, proto, slow, seed)[1]   # the same cell and seed, rerun
        row["tv_repeat"] = _tv(summary["staleness_histogram"], again["staleness_histogram"])
    if opts.cores:   # the same trace simulated again on the cores the run had
        row["cores"] = _again(tmp, [*argv, *latency, "--cores", opts.cores], real, summary)
        row["cores"]["cores"] = opts.cores
    if opts.poll and proto not in DRAWN:   # again, each message seen at the next poll
        row["poll"] = _again(tmp, [*argv, "--poll"], real, summary)
    repeat = "" if row.get("tv_repeat") is None else f" (the real repeat's {row['tv_repeat']:.3f})"
    print(f"validate: W={W} {proto}{' slow' if slow else ''} seed {seed}: real {real:.1f}/s, "
          f"sim {row['sim_updates_per_s']:.1f}/s (x{row['ratio']:.2f}), TV {row['tv']}"
          f"{repeat}, "
          f"accuracy real {row['real_acc']:.4f} sim {row['sim_acc']:.4f}", flush=True)
    if opts.keep:
        (opts.keep / f"{_name(W, proto, slow, seed)}.row.json").write_text(json.dumps(row))
    return row


def _again(tmp: Path, argv: list, real: float, summary: dict) -> dict:
    """The pair's simulation with other flags (``--cores``, ``--poll``): ratio, TV, accuracy."""
    sim = simulate(tmp, *argv)
    out = {"ratio": sim["steady_updates_per_s"] / real,
           "tv": _tv(summary["staleness_histogram"], sim["staleness"]["histogram"]),
           "sim_acc": sim["training"]["test_acc"], "sim_staleness": sim["staleness"]["histogram"]}
    print(f"validate:   {' '.join(map(str, argv[-2:]))}: x{out['ratio']:.2f}, TV {out['tv']}, "
          f"accuracy {out['sim_acc']:.4f}", flush=True)
    return out


def validate(tmp: Path, data: Path, opts) -> list:
    """Every (W, protocol, straggler, seed) pair of ``opts``: a real run and its simulation
    (``--real-only``: the real runs alone, kept for a later ``--from``; no rows)."""
    if opts.real_only:
        for W in opts.widths:
            for proto in opts.protocols:
                for slow in opts.stragglers:
                    for seed in range(1, opts.seeds + 1):
                        tl, summary = _real(opts.keep, data, W, proto, slow, opts, seed)
                        print(f"real: W={W} {proto}{' slow' if slow else ''} seed {seed}: "
                              f"{real_rate(_trace(tl)):.1f}/s, accuracy "
                              f"{summary['test_accuracy']:.4f}", flush=True)
        return []
    return [_pair(tmp, data, W, proto, slow, opts, seed)
            for W in opts.widths for proto in opts.protocols for slow in opts.stragglers
            for seed in range(1, opts.seeds + 1)]


def agreement(rows: list) -> list:
    """Per (W, protocol, straggler): the means over seeds of step time, ratio, TV and accuracy."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["W"], r["protocol"], r["straggler"]), []).append(r)
    out = []
    for (W, proto, slow), rs in groups.items():
        mean = {k: float(np.mean([r[k] for r in rs])) if rs[0][k] is not None else None
                for k in ("real_step_ms", "sim_step_ms", "ratio", "tv", "real_acc", "sim_acc")}
        out.append({"W": W, "protocol": proto, "straggler": slow, "seeds": len(rs), **mean,
                    "acc_gap_points": 100 * (mean["sim_acc"] - mean["real_acc"])})
        if all(r.get("tv_repeat") is not None for r in rs):
            out[-1]["tv_repeat"] = float(np.mean([r["tv_repeat"] for r in rs]))
        for again in ("cores", "poll"):
            if again in rs[0]:
                on = {k: float(np.mean([r[again][k] for r in rs]))
                      if rs[0][again][k] is not None else None for k in ("ratio", "tv", "sim_acc")}
                out[-1][again] = {**{k: v for k, v in rs[0][again].items() if k == "cores"}, **on,
                                  "acc_gap_points": 100 * (on["sim_acc"] - mean["real_acc"])}
    return out


# ---- 3. the table -----------------------------------------------------------------------

TABLE_MODEL = "mlp:784-128-10"


def _first_at(log: Path, target: float) -> float | None:
    """Simulated seconds of the first evaluation at ``target`` test accuracy (None: never)."""
    for line in log.read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "eval" and r["test_acc"] >= target:
            return r["simulated_s"]
    return None


def _cell(tmp: Path, data: Path, W: int, proto: str, comp: str, compute_ms: float,
          train: bool, opts) -> dict:
    S = max(1, W // 16)
    log = tmp / f"t-{W}-{proto}-{comp}.jsonl".replace(" ", "").replace("=", "")
    argv = ["--workers", W, "--servers", S, "--model", opts.table_model, *PROTOCOLS[proto],
            "--compute-ms", compute_ms, "--jitter", "lognormal:0.5", "--batch-size", 64]
    if train:
        argv += ["--data", data, "--epochs", opts.table_epochs, *TRAIN, *COMP[comp], "--train",
                 "--log", log, "--eval-every", max(1, 60000 // (W * 64) // 4)]
    else:
        argv += ["--steps", 20]
    sim = simulate(tmp, *argv)
    cell = {"W": W, "S": S, "protocol": proto, "comp": comp, "updates_per_s": sim["updates_per_s"],
            "staleness_mean": sim["staleness"]["mean"], "staleness_max": sim["staleness"]["max"],
            "bsp_updates_per_s": sim["bsp"]["updates_per_s"]}
    if train:
        cell.update(test_acc=sim["training"]["test_acc"], simulated_s=sim["simulated_s"],
                    time_to_target_s=_first_at(log, opts.target),
                    train_wall_s=sim["training"]["seconds"])
    print(f"table: W={W} {proto} {comp}: {cell['updates_per_s']:.0f}/s, staleness mean "
          f"{cell['staleness_mean']:.2f} max {cell['staleness_max']}"
          + (f", accuracy {cell['test_acc']:.4f}" if train else ""), flush=True)
    return cell


def table(tmp: Path, data: Path, opts, save) -> tuple[list, float]:
    from psgd.plan.command import measure_compute_s
    compute_ms = measure_compute_s(opts.table_model, 64, seconds=1.0) * 64e3
    cells = []
    for W in opts.table_widths:
        for proto in PROTOCOLS:
            for comp in ("none",) if proto == "bsp" else COMP:
                cells.append(_cell(tmp, data, W, proto, comp, compute_ms,
                                   W <= opts.table_train_upto, opts))
                save(cells, compute_ms)
    return cells, compute_ms


def markdown(result: dict) -> str:
    lines = ["## Speed", "", "| run | workers | updates | wall s |", "|---|---|---|---|"]
    for name, r in result["speed"].items():
        if name != "simpy":
            lines.append(f"| {name} | {r['workers']} | {r['updates']} | {r['wall_s']:.1f} |")
    lines += ["", f"SimPy: {json.dumps(result['speed'].get('simpy'))}", "",
              "## Validation (means over seeds)", "",
              "| W | protocol | straggler | seeds | real step ms | simulated | ratio (updates/s) "
              "| staleness TV | real acc | simulated acc | gap (points) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["agreement"]:
        tv = "-" if r["tv"] is None else f"{r['tv']:.3f}"
        lines.append(f"| {r['W']} | {r['protocol']} | {'W-1 slow=3' if r['straggler'] else '-'} "
                     f"| {r['seeds']} | {r['real_step_ms']:.2f} | {r['sim_step_ms']:.2f} | "
                     f"{r['ratio']:.2f} | {tv} | "
                     f"{r['real_acc']:.4f} | "
                     f"{r['sim_acc']:.4f} | {r['acc_gap_points']:+.2f} |")
    lines += _repeat_lines(result["agreement"])
    lines += _again_lines(result["agreement"], "cores") + _again_lines(result["agreement"], "poll")
    lines += ["", f"## Table ({result.get('table_model', TABLE_MODEL)}, compute "
              f"{result['compute_ms']:.2f} ms per batch of 64, 10gbit switched)", "",
              "| W | S | protocol | comp | updates/s | x bsp | staleness mean | max | "
              f"test acc | sim. s to {result['target']:.0%} |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["table"]:
        t = c.get("time_to_target_s")
        lines.append(f"| {c['W']} | {c['S']} | {c['protocol']} | {c['comp']} | "
                     f"{c['updates_per_s']:.0f} | {c['updates_per_s'] / c['bsp_updates_per_s']:.2f}"
                     f" | {c['staleness_mean']:.2f} | {c['staleness_max']} | "
                     f"{c.get('test_acc', float('nan')):.4f} | "
                     f"{'-' if t is None else f'{t:.2f}'} |")
    return "\n".join(lines)


def _repeat_lines(agreement: list) -> list:
    """The staleness TV of each real run from its repetition (--repeat-from) beside the
    simulator's from the run (none: [])."""
    rows = [r for r in agreement if "tv_repeat" in r]
    if not rows:
        return []
    lines = ["", "### Staleness TV: simulated against real, and real against its repetition", "",
             "| W | protocol | straggler | simulated vs real | real vs its repetition |",
             "|---|---|---|---|---|"]
    for r in rows:
        tv = "-" if r["tv"] is None else f"{r['tv']:.3f}"
        lines.append(f"| {r['W']} | {r['protocol']} | {'W-1 slow=3' if r['straggler'] else '-'} "
                     f"| {tv} | {r['tv_repeat']:.3f} |")
    return lines


def _again_lines(agreement: list, again: str) -> list:
    """The validation's rows simulated again with --cores or --poll (none: [])."""
    rows = [r for r in agreement if again in r]
    if not rows:
        return []
    flag = f"--cores {rows[0]['cores']['cores']}" if again == "cores" else "--poll"
    lines = ["", f"### The same traces simulated with {flag}", "",
             "| W | protocol | straggler | ratio | TV | gap (points) |", "|---|---|---|---|---|---|"]
    for r in rows:
        c = r[again]
        tv = "-" if c["tv"] is None else f"{c['tv']:.3f}"
        lines.append(f"| {r['W']} | {r['protocol']} | {'W-1 slow=3' if r['straggler'] else '-'} "
                     f"| {c['ratio']:.2f} | {tv} | {c['acc_gap_points']:+.2f} |")
    return lines


def _protocols(text: str) -> list:
    chosen = [p for p in text.split(",") if p]
    unknown = [p for p in chosen if p not in VALIDATED]
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown} not among {', '.join(VALIDATED)}")
    return chosen


def _widths(text: str) -> list:
    return [int(w) for w in text.split(",") if w]


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer cells, synthetic data")
    ap.add_argument("--target", type=float, default=0.80, help="test accuracy to time")
    ap.add_argument("--widths", type=_widths, default=None,
                    help="validation's W, comma-separated (default 2,4,8; --quick 2; '' none)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds per validation cell "
                    "(default 3; --quick 1)")
    ap.add_argument("--steps", type=int, default=None, help="steps of each validation run "
                    "(default 600, with --lr-schedule cosine the length at which real runs "
                    "repeat; --quick 30)")
    ap.add_argument("--model", default="mlp:784-128-10", help="validation's model")
    ap.add_argument("--lr-schedule", default="cosine", help="validation's --lr-schedule, real "
                    "runs and simulations (default cosine: it ends each run at lr 0, so its final "
                    "accuracy is not one step's spike; '' psgd's default)")
    ap.add_argument("--protocols", type=_protocols, default=list(VALIDATED),
                    help=f"validation's protocols, comma-separated (default {','.join(VALIDATED)})")
    ap.add_argument("--no-straggler", dest="stragglers", action="store_const", const=(False,),
                    default=(False, True), help="validate without --straggler runs only")
    ap.add_argument("--straggler-only", dest="stragglers", action="store_const", const=(True,),
                    help="validate with --straggler runs only")
    ap.add_argument("--cores", type=int, default=None, help="also simulate each validation "
                    "trace with psgd simulate --cores N (the cores the real runs shared)")
    ap.add_argument("--keep", type=Path, default=None, metavar="DIR", help="keep each real "
                    "run's timeline and log, and each validation row as NAME.row.json, in DIR")
    ap.add_argument("--from", dest="source", type=Path, default=None, metavar="DIR",
                    help="simulate the real runs kept in DIR by --keep instead of running them")
    ap.add_argument("--real-only", action="store_true", help="run and keep (--keep) the "
                    "validation's real runs only, to simulate later with --from")
    ap.add_argument("--repeat-from", dest="repeat", type=Path, default=None, metavar="DIR",
                    help="real runs of the same cells kept in DIR (--keep): each run's staleness "
                    "TV from its repetition is reported beside the simulator's (what a bar on "
                    "the TV can be tested to)")
    ap.add_argument("--no-speed", dest="speed", action="store_false",
                    help="skip part 1 (the event loop's speed)")
    ap.add_argument("--poll", action="store_true", help="also simulate each validation trace "
                    "with psgd simulate --poll (the network's latency, each message seen at the "
                    "receiver's next poll) instead of the pulls' latencies")
    ap.add_argument("--table-widths", type=_widths, default=None,
                    help="the table's W (default 16,64,256,1024; --quick 16,64; '' none)")
    ap.add_argument("--table-model", default=TABLE_MODEL, help=f"the table's model (default "
                    f"{TABLE_MODEL})")
    ap.add_argument("--table-epochs", type=float, default=2, help="epochs of each table cell's "
                    "training (default 2)")
    ap.add_argument("--table-train-upto", type=int, default=256, help="the largest W whose "
                    "cells train along the order (default 256; above: the event loop only)")
    common.add_output_arguments(ap)
    args = ap.parse_args()
    q = args.quick
    args.widths = ([2] if q else [2, 4, 8]) if args.widths is None else args.widths
    args.seeds = args.seeds or (1 if q else 3)
    args.steps = args.steps or (30 if q else 600)
    if args.real_only and not args.keep:
        ap.error("--real-only needs --keep DIR (where the runs are kept)")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    if args.table_widths is None:
        args.table_widths = [16, 64] if q else [16, 64, 256, 1024]
    return args


def main() -> None:
    args = arguments()
    out = common.out_dir(args, "simulate")
    stem = common.result_stem("simulate", args.quick)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = common.dataset(tmp, args.quick, "bench-simulate", train=20000 if args.quick else None)
        result = {"target": args.target, "table": [], "compute_ms": float("nan"),
                  "table_model": args.table_model, "argv": sys.argv[1:]}

        def save(cells=None, compute_ms=None):   # after each part: a cut-short run keeps its cells
            if cells is not None:
                result["table"], result["compute_ms"] = cells, compute_ms
            (out / f"{stem}.partial.json").unlink(missing_ok=True)   # one stamp, not one per save
            common.write_json(out / f"{stem}.partial.json", result, data.name)

        result["speed"] = speed(args.quick) if args.speed else {}
        save()
        result["validation"] = validate(tmp, data.path, args)
        result["agreement"] = agreement(result["validation"])
        save()
        table(tmp, data.path, args, save)
    common.write_json(out / f"{stem}.json", result, data.name)
    (out / f"{stem}.partial.json").unlink()
    common.write_text(out / f"{stem}.md", markdown(result), data.name)
    print(f"bench-simulate: wrote {out / stem}.{{json,md}}")


if __name__ == "__main__":
    main()
