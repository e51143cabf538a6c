"""Load time and memory of a worker's /train rows: dealt (the default) against a contiguous slice.

    make bench-data-order ARGS="[--rows 50000] [--workers 2 4] [--repeats 3] [--publish]"

Makes a 3x32x32 uint8 file of ``--rows`` rows (Fashion-MNIST from
/usr/share/datasets/fashion-mnist, padded to 32x32 and tinted per class, repeated as
needed; random pixels, results named *-synthetic, where the files are absent), written as ``psgd data convert`` writes
(gzip 4, 256-row chunks). Each measurement is one fresh process that builds
``ShardReader(file, 0, W, 64, deal=...)``: wall time of the constructor and the growth of
the process's peak RSS (VmHWM) over its value before it. Modes alternate within each repeat.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
FASHION = Path("/usr/share/datasets/fashion-mnist")
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
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
    if common.data_name(False) == common.SYNTHETIC:
        print("bench_data_order: WARNING: Fashion-MNIST is not installed (apt-get install "
              "dataset-fashion-mnist); using random images, results named *-synthetic", flush=True)
        rng = np.random.default_rng(0)
        return rng.integers(0, 256, (n, 3, 32, 32), np.uint8), rng.integers(0, 10, n)
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
    common.add_output_arguments(ap)
    args = ap.parse_args()
    out = common.out_dir(args, "data-order")   # before any run
    data = common.data_name(False)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "order.h5"
        what = make_file(path, args.rows)
        size = path.stat().st_size / 2 ** 20
        results = {}
        for _ in range(args.repeats):
            for w in args.workers:
                for mode in ("slice", "deal"):
                    results.setdefault((w, mode), []).append(measure(path, w, mode))
    lines = [f"{what}, {args.rows} rows, file {size:.1f} MiB", "",
             "| W | rows read by worker 0 | mode | load s (median, range) | peak RSS growth MiB "
             "| held MiB |", "|---|---|---|---|---|---|"]
    for (w, mode), runs in results.items():
        t = [r[0] for r in runs]
        rss = [r[1] for r in runs]
        lines.append(f"| {w} | {args.rows // w} | {mode} | {statistics.median(t):.3f} "
                     f"({min(t):.3f}-{max(t):.3f}) | {statistics.median(rss):.0f} "
                     f"({min(rss):.0f}-{max(rss):.0f}) | {runs[0][2]:.0f} |")
    print("\n".join(lines))
    stem = common.result_stem("data-order", False)
    common.write_json(out / f"{stem}.json", {"runs": {f"{w}-{m}": r for (w, m), r in
                                                      results.items()}}, data)
    common.write_text(out / f"{stem}.md", "\n".join(lines), data)
    print(f"wrote {out}/{stem}.{{json,md}}")

if __name__ == "__main__":
    main()
