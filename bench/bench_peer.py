"""psgd against PyTorch on the same HDF5 files: test accuracy per epoch and samples/s, 1 and 2 ranks, +- --augment.

psgd runs `mpiexec -n R python -m psgd train --protocol allreduce --servers 0`; PyTorch runs the same
network (psgd.nn.torch_peer, torch's default init) with torch.optim.SGD, in one process (2 threads) or
as R DistributedDataParallel processes on gloo (1 thread each).  Both: momentum 0.9, the same lr and
per-rank batch, the same epochs.  `make bench-peer ARGS="--epochs 3 --seeds 0,1,2 --train 0"` scales up.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402
import peer_data  # noqa: E402
from peer_torch_train import train_torch  # noqa: E402

ROOT = HERE.parent
MODELS = {"lenet": "fashion", "cifar-cnn": "colour", "resnet8": "colour"}


def train_psgd(path: Path, model: str, *, ranks: int, epochs: int, batch_size: int, lr: float,
               seed: int, augment: bool, log: Path) -> list[dict]:
    """Per-epoch test accuracy and samples/s of `psgd train` under allreduce on ``ranks`` workers."""
    import h5py
    with h5py.File(path, "r") as f:
        n = f["train/y"].shape[0]
    per_epoch = (n // ranks) // batch_size
    cmd = [common.mpiexec(), "-n", str(ranks), sys.executable, "-m", "psgd", "train",
           "--data", str(path), "--model", model, "--protocol", "allreduce", "--servers", "0",
           "--optimizer", "momentum", "--momentum", "0.9", "--lr", str(lr), "--batch-size", str(batch_size),
           "--epochs", str(epochs), "--seed", str(seed), "--eval-every", str(per_epoch),
           "--log-every", str(per_epoch), "--log", str(log), "--overwrite", "--quiet"]
    if augment:
        cmd.append("--augment")
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=3600)
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    accs = [r["test_accuracy"] for r in recs if r["kind"] == "eval"]
    rates = [r["est_global_samples_per_s"] for r in recs if r["kind"] == "step"]
    return [{"epoch": e + 1, "test_acc": a, "samples_per_s": rates[min(e, len(rates) - 1)]}
            for e, a in enumerate(accs[:epochs])]


def cell(fn, seeds, key: str = "test_acc", **kw) -> list[dict]:
    """Per epoch: the mean, min and max test accuracy over the seeds (of each key in
    ``key``'s family: ``test_acc`` and, where the runs give it, ``test_acc_precise``), and the
    mean samples/s."""
    runs = [fn(seed=s, **kw) for s in seeds]
    out = []
    for e in range(len(runs[0])):
        row = {"rate": float(np.mean([r[e]["samples_per_s"] for r in runs]))}
        for name in (k for k in runs[0][e] if k.startswith(key)):
            accs = [r[e][name] for r in runs]
            row[name] = {"mean": float(np.mean(accs)), "lo": min(accs), "hi": max(accs)}
        out.append(row)
    return out


def fmt(c: dict, n: int) -> str:
    return f"{c['mean']:.4f}" + (f" ({c['lo']:.4f}-{c['hi']:.4f})" if n > 1 else "")


def diff(a: dict, b: dict) -> str:
    return f"{100 * (a['mean'] - b['mean']):+.1f} pt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lenet,cifar-cnn,resnet8")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--augment", default="no,yes", help="no, yes or no,yes")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--train", type=int, default=6000, help="training rows per file (0: all 60000)")
    ap.add_argument("--test", type=int, default=2000, help="test rows per file (0: all 10000)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    common.add_output_arguments(ap)
    args = ap.parse_args()
    out = common.out_dir(args, "peer")   # before any run
    seeds = [int(s) for s in args.seeds.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-peer-"))
    files = {"fashion": peer_data.fashion(tmp / "fashion.h5", args.train, args.test),
             "colour": peer_data.colour(tmp / "colour.h5", args.train, args.test)}
    lines = [f"{args.train or 60000} train / {args.test or 10000} test rows; momentum 0.9 lr "
             f"{args.lr}, batch {args.batch_size} per rank; seeds {args.seeds}", "",
             "| model | ranks | augment | epoch | psgd acc | torch acc | psgd - torch | "
             "torch acc, precise BN | psgd - that | psgd samples/s | torch samples/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for model in args.models.split(","):
        for ranks in map(int, args.ranks.split(",")):
            for aug in args.augment.split(","):
                kw = dict(ranks=ranks, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                          augment=aug == "yes")
                ours = cell(train_psgd, seeds, path=files[MODELS[model]], model=model,
                            log=tmp / "psgd.jsonl", **kw)
                theirs = cell(train_torch, seeds, path=str(files[MODELS[model]]), model=model,
                              momentum=0.9, **kw)
                n = len(seeds)
                for e, (a, b) in enumerate(zip(ours, theirs), 1):
                    mine, plain, precise = a["test_acc"], b["test_acc"], b["test_acc_precise"]
                    lines.append(f"| {model} | {ranks} | {aug} | {e} | {fmt(mine, n)} | "
                                 f"{fmt(plain, n)} | {diff(mine, plain)} | {fmt(precise, n)} | "
                                 f"{diff(mine, precise)} | {a['rate']:.0f} | {b['rate']:.0f} |")
                    print(lines[-1], flush=True)
    data = "Fashion-MNIST (lenet) and tinted Fashion-MNIST 3x32x32 (cifar-cnn, resnet8)"
    print(f"wrote {common.write_text(out / 'peer.md', chr(10).join(lines), data)}")

if __name__ == "__main__":
    main()
