"""Elastic asp: a run that loses one of its workers and gains another, against one that does not.

Each run is a server job (`psgd train --elastic`) and `psgd join` jobs, every one its own
mpiexec. ``cut``: W workers from the start, one SIGKILLed (its whole mpiexec) at 30 % of the
updates, a new one joining at 50 %. ``lose``: the same kill, and no one joins (issue #53's
comparison: 4 workers losing one against 3 from the start). ``whole``: the same W workers,
uninterrupted. ``fewer``: W - 1 workers throughout. All apply the same number of updates (counted by the server), so
the same samples. Prints a markdown table; writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common


def _job(args: list, out: Path) -> subprocess.Popen:
    cmd = [common.mpiexec(), "-n", "1", sys.executable, "-m", "psgd", *map(str, args)]
    return subprocess.Popen(cmd,
                            stdout=open(out, "w"), stderr=subprocess.STDOUT, cwd=common.ROOT,
                            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _updates(log: Path) -> int:
    if not log.exists():
        return 0
    steps = [json.loads(x) for x in log.read_text().splitlines() if '"kind": "step"' in x]
    return max((r["updates"] for r in steps), default=0)


def _until(test, timeout: float = 300.0) -> None:
    t0 = time.monotonic()
    while not test():
        if time.monotonic() - t0 > timeout:
            raise SystemExit("bench_elastic: a run did not reach its next event in time")
        time.sleep(0.05)


SCENARIOS = {"whole": "uninterrupted", "cut": "lose 1 at 30 %, gain 1 at 50 %",
             "lose": "lose 1 at 30 %", "fewer": "one worker fewer throughout"}


def one_run(tmp: Path, data: Path, a, scenario: str) -> dict:
    """One elastic run; its server's summary with the wall time from the first join."""
    port, log = tmp / "port", tmp / "log.jsonl"
    server = _job(["train", "--elastic", "--protocol", "asp", "--data", data, "--model", a.model,
                   "--optimizer", "sgd", "--lr", a.lr, "--batch-size", a.batch_size,
                   "--epochs", a.epochs, "--seed", a.seed, "--port-file", port, "--log", log,
                   "--log-every", 50, "--stall-timeout", a.stall_timeout], tmp / "server.out")
    _until(port.exists)
    n = a.workers - (scenario == "fewer")
    joiners = [_job(["join", "--port-file", port], tmp / f"join{k}.out") for k in range(n)]
    if scenario in ("cut", "lose"):
        _until(lambda: log.exists() and '"total_updates"' in log.read_text())
        total = json.loads(log.read_text().splitlines()[0])["total_updates"]
        _until(lambda: _updates(log) >= 0.3 * total)
        os.killpg(joiners[0].pid, signal.SIGKILL)
    if scenario == "cut":
        _until(lambda: _updates(log) >= 0.5 * total)
        joiners.append(_job(["join", "--port-file", port], tmp / "join-late.out"))
    for p in [server, *joiners]:
        p.wait(timeout=900)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    summary = next(r for r in records if r["kind"] == "summary")
    return {"scenario": scenario, "wall_s": summary["wall_s"],
            "test_accuracy": summary["test_accuracy"],
            "updates": summary["updates"], "workers": summary["workers"],
            "events": [r for r in records if r["kind"] in ("joined", "lost", "left")]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--model", default="mlp:784-128-10")
    ap.add_argument("--lr", default="0.05")
    ap.add_argument("--batch-size", default="64")
    ap.add_argument("--epochs", default="2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--stall-timeout", default="3")
    ap.add_argument("--scenarios", default="whole,cut,fewer",
                    help=f"comma-separated, of {', '.join(SCENARIOS)} (default whole,cut,fewer)")
    ap.add_argument("--quick", action="store_true", help="synthetic data")
    common.add_output_arguments(ap)
    a = ap.parse_args()
    scenarios = a.scenarios.split(",")
    if not set(scenarios) <= set(SCENARIOS):
        ap.error(f"--scenarios: choose from {', '.join(SCENARIOS)}, got {a.scenarios}")
    out = common.out_dir(a, "elastic")
    with tempfile.TemporaryDirectory() as tmp:
        data = common.dataset(Path(tmp), a.quick, "bench_elastic")
        runs = []
        print(f"| run ({a.workers} workers) | updates | wall s | test accuracy |\n"
              f"|---|---|---|---|", flush=True)
        for r in range(a.repeats):
            for scenario in scenarios:
                d = Path(tmp) / f"run{r}-{scenario}"
                d.mkdir()
                runs.append(one_run(d, data.path, a, scenario))
                print(f"| {SCENARIOS[scenario]} | {runs[-1]['updates']} | "
                      f"{runs[-1]['wall_s']:.1f} | "
                      f"{runs[-1]['test_accuracy']:.4f} |", flush=True)
    common.write_json(out / f"{common.result_stem('elastic', a.quick)}.json",
                      {"args": vars(a), "runs": runs}, data.name)


if __name__ == "__main__":
    main()
