"""How far float32 trajectories stray from the exact one: psgd and PyTorch (float32) against PyTorch in
float64, over the peer harness's 100 steps (the basis of tests/test_peer_torch.py's tolerance).

    make bench-peer-float64 ARGS="[--models M,..] [--optimizers O,..] [--publish]"
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import test_peer_torch as harness  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(harness.MODELS))
    ap.add_argument("--optimizers", default=",".join(harness.LR))
    common.add_output_arguments(ap)
    args = ap.parse_args()
    out = common.out_dir(args, "peer-float64")
    lines = ["| model | optimizer | psgd - torch (max) | psgd - float64 (max) | "
             "torch - float64 (max) |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name in args.models.split(","):
        for opt in args.optimizers.split(","):
            r = np.array(list(harness.trajectory(name, opt, reference=True)))
            lines.append(f"| {name} | {opt} | {r[:, 0].max():.1e} | {r[:, 1].max():.1e} | "
                         f"{r[:, 2].max():.1e} |")
            print(lines[-1], flush=True)
    data = "the peer harness's random batches"
    print(f"wrote {common.write_text(out / 'peer-float64.md', chr(10).join(lines), data)}")

if __name__ == "__main__":
    main()
