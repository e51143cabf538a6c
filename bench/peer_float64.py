"""How far float32 trajectories stray from the exact one: psgd and PyTorch (float32) against PyTorch in
float64, over the peer harness's 100 steps (the basis of tests/test_peer_torch.py's tolerance).

    .venv/bin/python bench/peer_float64.py [MODELS [OPTIMIZERS]]   (comma lists; default all)
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import test_peer_torch as harness  # noqa: E402


def main() -> None:
    models = sys.argv[1].split(",") if len(sys.argv) > 1 else list(harness.MODELS)
    opts = sys.argv[2].split(",") if len(sys.argv) > 2 else list(harness.LR)
    print("| model | optimizer | psgd - torch (max) | psgd - float64 (max) | torch - float64 (max) |")
    print("|---|---|---|---|---|")
    for name in models:
        for opt in opts:
            r = np.array(list(harness.trajectory(name, opt, reference=True)))
            print(f"| {name} | {opt} | {r[:, 0].max():.1e} | {r[:, 1].max():.1e} | {r[:, 2].max():.1e} |",
                  flush=True)


if __name__ == "__main__":
    main()
