"""Load time and memory of a worker's /train rows: dealt (the default) against a contiguous slice.

    .venv/bin/python bench/bench_data_order.py [--rows 50000] [--workers 2 4] [--repeats 3]

Makes a 3x32x32 uint8 file of ``--rows`` rows (Fashion-MNIST from
/usr/share/datasets/fashion-mnist, padded to 32x32 and tinted per class, repeated as
needed; random strokes where the files are absent), written as ``psgd data convert`` writes
(gzip 4, 256-row chunks). Each measurement is one fresh process that builds
``ShardReader(file, 0, W, 64, deal=...)``: wall time of the constructor and the growth of
the process's peak RSS (VmHWM) over its value before it. Modes alternate within each repeat.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FASHION = Path("/usr/share/datasets/fashion-mnist")
ONE = """
import sys, time
from psgd.data.reader import ShardReader
def hwm():   # this process's peak RSS in KiB (ru_maxrss would carry the parent's over exec)
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
path, w, deal = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "deal"
before = hwm()
t0 = time.perf_counter()
r = ShardReader(path, 0, w, 64, seed=0, deal=deal)
t = time.perf_counter() - t0
print(t, (hwm() - before) / 1024, r.x.nbytes / 2 ** 20)
"""


def _images(n: int) -> tuple[np.ndarray, np.ndarray]:
    from psgd.data.idx import read_idx_images, read_idx_labels
    x = read_idx_images(FASHION / "train-images-idx3-ubyte.gz")[:, 0]
    y = read_idx_labels(FASHION / "train-labels-idx1-ubyte.gz").astype(np.int64)
    reps = -(-n // len(y))
    x, y = np.concatenate([x] * reps)[:n], np.concatenate([y] * reps)[:n]
    tint = np.random.default_rng(0).uniform(0.4, 1.0, (10, 3))
    out = np.zeros((n, 3, 32, 32), np.uint8)
    for c in range(3):
        out[:, c, 2:30, 2:30] = (x * tint[y, c][:, None, None]).astype(np.uint8)
    return out, y


def make_file(path: Path, n: int) -> str:
    from psgd.data.layout import write_dataset
    x, y = _images(n)
    write_dataset(path, x, y, x[:1000], y[:1000], n_classes=10, source="bench-data-order")
    return "fashion-mnist tinted 3x32x32"


def measure(path: Path, w: int, mode: str) -> tuple[float, float, float]:
    out = subprocess.run([sys.executable, "-c", ONE, str(path), str(w), mode], check=True,
                         capture_output=True, text=True, cwd=ROOT).stdout.split()
    return float(out[0]), float(out[1]), float(out[2])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50000)
    ap.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "order.h5"
        what = make_file(path, args.rows)
        size = path.stat().st_size / 2 ** 20
        results = {}
        for _ in range(args.repeats):
            for w in args.workers:
                for mode in ("slice", "deal"):
                    results.setdefault((w, mode), []).append(measure(path, w, mode))
    print(f"# {what}, {args.rows} rows, file {size:.1f} MiB, commit {commit}, "
          f"{platform.processor() or platform.machine()}")
    print("| W | rows read by worker 0 | mode | load s (median, range) | peak RSS growth MiB | held MiB |")
    print("|---|---|---|---|---|---|")
    for (w, mode), runs in results.items():
        t = [r[0] for r in runs]
        rss = [r[1] for r in runs]
        print(f"| {w} | {args.rows // w} | {mode} | {statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f}) "
              f"| {statistics.median(rss):.0f} ({min(rss):.0f}-{max(rss):.0f}) | {runs[0][2]:.0f} |")
    print(json.dumps({f"{w}-{m}": r for (w, m), r in results.items()}))


if __name__ == "__main__":
    main()
