"""Merge bench_stragglers.py runs made one per invocation (``--out DIR`` each) into one JSON,
and write (to OUT.seeds.md) and print per-seed times to the target with each config's bootstrap interval of the ratio
of its mean to the best fixed s's mean.

    make bench-stragglers-merge ARGS="OUT.json RUN_DIR..."
    .venv/bin/python bench/merge_straggler_runs.py OUT.json RUN_DIR...

Each RUN_DIR holds a stragglers.json (or stragglers-synthetic.json); OUT's name must say
synthetic when theirs do.
"""
from __future__ import annotations

import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

FIXED = ("ssp s=1", "ssp s=3", "ssp s=8")


def bootstrap_ratio(a: list[float], b: list[float], n: int = 10000, seed: int = 0):
    """95 % percentile interval of mean(a) / mean(b), resampling each list's seeds."""
    rng = random.Random(seed)
    ratios = sorted(statistics.mean(rng.choices(a, k=len(a))) /
                    statistics.mean(rng.choices(b, k=len(b))) for _ in range(n))
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def paired_ratio(a: dict, b: dict, n: int = 10000, seed: int = 0):
    """As ``bootstrap_ratio`` but resampling the seeds both have together (the same seed
    draws the same pauses and batches)."""
    rng = random.Random(seed)
    common = sorted(set(a) & set(b))
    ratios = sorted(sum(a[s] for s in pick) / sum(b[s] for s in pick) for pick in
                    (rng.choices(common, k=len(common)) for _ in range(n)))
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def per_seed(rows: list[dict]) -> str:
    """Markdown: per cell, each config's seconds to the target per seed, mean, range and
    its mean over the best fixed s's mean with a bootstrap interval."""
    cells: dict = {}
    for r in rows:
        cells.setdefault((r["scenario"], r["workers"]), {}).setdefault(r["protocol"], {})[
            r["seed"]] = r.get("time_to_target")
    out = []
    for (sc, w), by_p in cells.items():
        seeds = sorted({s for d in by_p.values() for s in d})
        means = {p: statistics.mean(d.values()) for p, d in by_p.items() if None not in d.values()}
        best = min((p for p in means if p in FIXED), key=means.get)
        out += [f"\n### {sc}, W={w} (best fixed s by mean: {best})\n",
                "| protocol | " + " | ".join(f"seed {s}" for s in seeds)
                + " | mean | range | vs best fixed s (95 % bootstrap; paired by seed) |",
                "|---" * (len(seeds) + 4) + "|"]
        for p, d in sorted(by_p.items()):
            if p not in means:
                out.append(f"| {p} | " + " | ".join(str(d.get(s)) for s in seeds) + " | - | - | - |")
                continue
            lo, hi = bootstrap_ratio(list(d.values()), list(by_p[best].values()))
            plo, phi = paired_ratio(d, by_p[best])
            out.append(f"| {p} | " + " | ".join(f"{d[s]:.1f}" if d.get(s) is not None else "-"
                                                 for s in seeds)
                       + f" | {means[p]:.2f} | {min(d.values()):.1f}-{max(d.values()):.1f} | "
                       f"{means[p] / means[best]:.2f}x ({lo:.2f}-{hi:.2f}; {plo:.2f}-{phi:.2f}) |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit("usage: merge_straggler_runs.py OUT.json RUN_DIR...")
    out, dirs = Path(argv[0]), argv[1:]
    rows, saved = [], None
    for d in dirs:
        found = [p for p in (Path(d) / "stragglers.json", Path(d) / "stragglers-synthetic.json")
                 if p.exists()]
        if not found:   # not run (yet)
            continue
        saved = json.loads(found[0].read_text())
        rows += saved["rows"]
    if saved is None:
        raise SystemExit(f"merge_straggler_runs: no stragglers.json in {', '.join(dirs)}")
    common.write_json(out, {"data": saved["data"], "settings": saved["settings"],
                            "rows": rows, "merged_from": dirs}, saved["data"])
    text = per_seed(rows)
    common.write_text(out.with_suffix(".seeds.md"), text, saved["data"])
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
