"""Rows two sparse hogwild workers both write: a replay of their batches, no MPI.

    make bench-sparse-sharing ARGS="--data sparse.h5 [--batch-size 4] [--hold 8]"
    make bench-sparse-sharing ARGS=--line-transfer

The table goes to runs/bench/sparse-sharing-TIME/sparse-sharing.md (--publish: bench/results/).

Two workers take the halves of the training rows in order, a batch at a time, in turn.
For each hot-row threshold (a row is held when a batch touches it with probability above
it: :func:`psgd.hogwild.hot.hot_rows`, which psgd runs at 0.5) it prints the rows held, the
rows a step touches that are not held and were last written by the other worker since this
one touched them (on a vector that stays in both cores' caches, each is a cache line moved
between the cores), and the held rows' share of a settle every ``--hold`` steps (added,
then read back: two moves per held row). ``--line-transfer`` times one cache line passed
back and forth between two processes pinned to CPUs 0 and 1 (Linux).
"""
from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from pathlib import Path

import h5py
import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from psgd.hogwild.hot import hot_rows  # noqa: E402
from psgd.kernels.atomic import atomic_add, atomic_load  # noqa: E402


def batches(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray, batch: int,
            steps: int, bias: int) -> list[np.ndarray]:
    """The rows each of the first ``steps`` batches of ``rows`` touches: its distinct features'
    and the bias row ``bias``."""
    return [np.append(np.unique(indices[np.concatenate([
        np.arange(indptr[r], indptr[r + 1]) for r in rows[s * batch:(s + 1) * batch]])]), bias)
        for s in range(steps)]


def shared_rows(work: list[list[np.ndarray]], held: np.ndarray) -> float:
    """Rows per step, not held, that the other worker wrote since this one last touched them."""
    n = held.size
    last_touch = np.full((2, n), -1)
    last_write, writer = np.full(n, -1), np.full(n, -1)
    moved = 0
    steps = len(work[0])
    for s in range(steps):
        for w in (0, 1):
            t = work[w][s]
            t = t[~held[t]]
            moved += int(np.sum((writer[t] == 1 - w) & (last_write[t] > last_touch[w, t])))
            last_touch[w, t] = last_write[t] = 2 * s + w
            writer[t] = w
    return moved / (2 * steps)


@njit
def _volley(flag, me, other, rounds):
    """Wait for ``flag[0] == me``, then hand it to ``other``; ``rounds`` times."""
    for _ in range(rounds):
        while atomic_load(flag, 0) != me:
            pass
        atomic_add(flag, 0, other - me)


def line_transfer_ns(rounds: int = 200_000) -> float:
    """Nanoseconds to pass one cache line from CPU 0 to CPU 1 (half a round trip)."""
    mask = os.sched_getaffinity(0)
    if not {0, 1} <= mask:
        raise SystemExit(f"sparse_sharing: --line-transfer needs CPUs 0 and 1, this process "
                         f"may run on {sorted(mask)}")
    flag = np.frombuffer(mmap.mmap(-1, 4096), dtype=np.int64, count=8)
    _volley(np.zeros(1, np.int64), 0, 0, 0)                  # compile before the fork
    flag[0] = 0
    pid = os.fork()
    if pid == 0:
        try:
            os.sched_setaffinity(0, {1})
            _volley(flag, 1, 0, rounds)
        finally:
            os._exit(0)
    os.sched_setaffinity(0, {0})
    try:
        t = time.perf_counter()
        _volley(flag, 0, 1, rounds)
        return (time.perf_counter() - t) / (2 * rounds) * 1e9
    finally:
        os.waitpid(pid, 0)
        os.sched_setaffinity(0, mask)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="a sparse HDF5 set (psgd data synth --sparse)")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--hold", type=int, default=8, help="steps between settles (--hold-hot)")
    ap.add_argument("--steps", type=int, default=3000, help="steps replayed per worker")
    ap.add_argument("--thresholds", default="0.5,0.3,0.2,0.1,0.05")
    ap.add_argument("--line-transfer", action="store_true",
                    help="time a cache line passed between CPUs 0 and 1 (three times) instead")
    common.add_output_arguments(ap)
    args = ap.parse_args()
    if not args.data and not args.line_transfer:
        ap.error("--data is needed (or --line-transfer)")
    out = common.out_dir(args, "sparse-sharing")
    lines = replay(args) if args.data else [
        "one cache line, CPU 0 to CPU 1: "
        + ", ".join(f"{line_transfer_ns():.0f}" for _ in range(3)) + " ns"]
    name = "sparse-sharing" if args.data else "line-transfer"
    path = common.write_text(out / f"{name}.md", "\n".join(lines), args.data or common.NO_DATA)
    print(f"wrote {path}")


def replay(args) -> list[str]:
    """The replay's table, printed as it goes."""
    lines = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    with h5py.File(args.data, "r") as f:
        indptr, indices = f["train/indptr"][()], f["train/indices"][()]
        features = int(f.attrs["n_features"])
    n = indptr.size - 1
    steps = min(args.steps, n // (2 * args.batch_size))
    halves = (np.arange(n // 2), np.arange(n // 2, n))
    work = [batches(indptr, indices, h, args.batch_size, steps, features) for h in halves]
    say(f"{n} rows, {features} features, batch {args.batch_size}, {steps} steps per worker; "
        f"rows per step, each of K floats\n")
    say("| held when touched above | rows held | shared rows not held | settle | total |")
    say("|---|---|---|---|---|")
    shared = shared_rows(work, np.zeros(features + 1, bool))
    say(f"| none (--hold-hot 1) | 0 | {shared:.1f} | 0 | {shared:.1f} |")
    for threshold in map(float, args.thresholds.split(",")):
        held = hot_rows(indices, n, features + 1, args.batch_size, args.hold, threshold)[0] >= 0
        shared, settle = shared_rows(work, held), 2 * int(held.sum()) / args.hold
        say(f"| {threshold} | {int(held.sum())} | {shared:.1f} | {settle:.1f} | "
            f"{shared + settle:.1f} |")
    return lines


if __name__ == "__main__":
    main()
