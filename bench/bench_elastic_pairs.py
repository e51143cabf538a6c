"""Elastic adpsgd: W workers, one SIGKILLed at 30 % of its clocks, against W - 1 from the start
at the same samples (issue #53's accuracy check, applied to adpsgd).

Each run is a coordinator (`psgd train --elastic --protocol adpsgd`) and `psgd join` jobs,
every one its own mpiexec, joined one at a time so that joiner k is worker k. ``lose``: W
workers for C clocks each, worker ``--victim`` SIGKILLs itself (PSGD_X_FAULT) in its clock
0.3 C. The default victim is active (slot W - 2): active workers wait for their pairings and
so pace the run, while a passive one runs through its clocks ahead of them, so 30 % of a
passive one's clocks comes early in the run. ``whole``: W workers for C clocks, nobody
killed. ``fewer``: W - 1 workers for round(C (W - 1 + 0.3) / (W - 1)) clocks each, the same
number of batches as ``lose``. Prints a markdown table; writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

KILL_AT = 0.3


def _job(args: list, out: Path, env: dict) -> subprocess.Popen:
    cmd = [common.mpiexec(), "-n", "1", sys.executable, "-m", "psgd", *map(str, args)]
    return subprocess.Popen(cmd, stdout=open(out, "w"), stderr=subprocess.STDOUT,
                            cwd=common.ROOT, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **env))


def _until(test, what: str, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while not test():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"bench_elastic_pairs: waited {timeout:.0f} s for {what}")
        time.sleep(0.05)


def one_run(tmp: Path, data: Path, a, scenario: str, seed: int) -> dict:
    """One run; the coordinator's summary and the clocks each worker was given."""
    port, log = tmp / "port", tmp / "log.jsonl"
    W = a.workers - (scenario == "fewer")
    clocks = a.clocks if scenario != "fewer" else round(a.clocks * (W + KILL_AT) / W)
    victim = W - 2 if a.victim is None else a.victim
    kill = int(KILL_AT * a.clocks)
    server = _job(["train", "--elastic", "--protocol", "adpsgd", "--servers", 0, "--data", data,
                   "--model", a.model, "--optimizer", "sgd", "--lr", a.lr,
                   "--lr-schedule", "constant", "--batch-size", a.batch_size,
                   "--steps", clocks, "--seed", seed, "--max-workers", W,
                   "--port-file", port, "--log", log, "--stall-timeout", 10,
                   "--no-worker-timeout", 120], tmp / "server.out", {})
    _until(port.exists, "the port file")
    t0, joiners = time.monotonic(), []
    for k in range(W):
        fault = {"PSGD_X_FAULT": f"rank=0,step={kill},kind=kill"} \
            if scenario == "lose" and k == victim else {}
        joiners.append(_job(["join", "--port-file", port], tmp / f"join{k}.out",
                            fault))
        _until(lambda: f"worker {k} joined" in (tmp / "server.out").read_text(),
               f"worker {k} to join")
    for p in [server, *joiners]:
        p.wait(timeout=900)
    records = [json.loads(x) for x in log.read_text().splitlines()]
    summary = next(r for r in records if r["kind"] == "summary")
    return {"scenario": scenario, "seed": seed, "workers_at_start": W, "clocks": clocks,
            "victim": victim if scenario == "lose" else None,
            "kill_clock": kill if scenario == "lose" else None,
            "wall_s": summary["wall_s"], "wall_from_first_join_s": time.monotonic() - t0,
            "test_accuracy": summary["test_accuracy"], "test_loss": summary["test_loss"],
            "workers": summary["workers"], "codes": [p.returncode for p in [server, *joiners]]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--model", default="mlp:784-128-10")
    ap.add_argument("--lr", default="0.05")
    ap.add_argument("--batch-size", default="64")
    ap.add_argument("--clocks", type=int, default=3000, help="each worker's clocks (lose)")
    ap.add_argument("--seeds", default="0", help="comma-separated --seed values")
    ap.add_argument("--victim", type=int, default=None,
                    help="the worker lose kills (default W - 2, an active one)")
    ap.add_argument("--scenarios", default="lose,fewer", help="of lose, fewer, whole")
    ap.add_argument("--data", default=None, help="a converted .h5 (default: convert now)")
    ap.add_argument("--quick", action="store_true", help="synthetic data")
    common.add_output_arguments(ap)
    a = ap.parse_args()
    out = common.out_dir(a, "elastic-pairs")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(a.data) if a.data else common.dataset(Path(tmp), a.quick,
                                                          "bench_elastic_pairs").path
        runs = []
        print("| run | seed | clocks each | wall s | lost after s | test accuracy |\n"
              "|---|---|---|---|---|---|", flush=True)
        for seed in map(int, a.seeds.split(",")):
            for scenario in a.scenarios.split(","):
                d = Path(tmp) / f"seed{seed}-{scenario}"
                d.mkdir()
                runs.append(one_run(d, data, a, scenario, seed))
                r = runs[-1]
                lost = [f"{w['after_s']:.1f}" for w in r["workers"] if w["state"] == "lost"]
                print(f"| {scenario} ({r['workers_at_start']} at start) | {seed} | {r['clocks']} | "
                      f"{r['wall_s']:.1f} | {', '.join(lost)} | {r['test_accuracy']:.4f} |",
                      flush=True)
                common.write_json(out / f"{common.result_stem('elastic-pairs', a.quick)}.json",
                                  {"args": vars(a), "runs": runs},
                                  common.data_name(a.quick))


if __name__ == "__main__":
    main()
