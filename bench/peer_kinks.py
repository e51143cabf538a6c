"""Where psgd's float32 trajectory leaves the exact (PyTorch float64) one: per step, the ReLU signs and
max-pool arg-maxes in which the two forwards differ, beside the gradient's and the parameters' distance.

    make bench-peer-kinks ARGS="--model resnet8 --optimizer sgd [--same-params] [--publish]"

With --same-params the float64 net is given psgd's parameters before every step, so the gradient
error is that of one step from the same point.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import test_peer_torch as harness  # noqa: E402


def run(name, opt, same_params, steps):
    """(step, flips per switch layer, gradient relative error, ||psgd - float64|| / distance moved)."""
    model, _, x, y = harness.setup(name)
    ref, seen = harness.float64_peer(model)
    wd = 5e-4 if opt in ("momentum", "adam") else 0.0
    ours = harness.make_optimizer(opt, model.n_params, weight_decay=wd)
    theirs = harness.torch_optimizer(opt, ref.net.parameters(), harness.LR[opt], wd)
    p0 = model.params.astype(np.float64)
    for step in range(steps):
        s = (step % 4) * harness.BATCH
        xb, yb = x[s:s + harness.BATCH], y[s:s + harness.BATCH]
        if same_params:
            ref.load(model.params.astype(np.float64))
        model.reseed(0, step)
        model.loss_and_grad(xb, yb)
        seen.clear()
        harness.torch_step(ref, xb, yb)
        flips = harness.flips(model, seen)
        gerr = harness.relerr(model.grad, ref.flat("grad", np.float64))
        ours.step(model.params, model.grad, harness.LR[opt])
        theirs.step()
        p = ref.flat(dtype=np.float64)
        yield step + 1, flips, gerr, np.linalg.norm(model.params - p) / max(np.linalg.norm(p - p0), 1e-30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet8", choices=list(harness.MODELS))
    ap.add_argument("--optimizer", default="sgd", choices=list(harness.LR))
    ap.add_argument("--steps", type=int, default=harness.STEPS)
    ap.add_argument("--same-params", action="store_true")
    common.add_output_arguments(ap)
    args = ap.parse_args()
    out = common.out_dir(args, "peer-kinks")
    lines = ["| step | flips per ReLU / max-pool | gradient rel. error | psgd - float64 |",
             "|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for step, flips, gerr, dist in run(args.model, args.optimizer, args.same_params, args.steps):
        lines.append(f"| {step} | {flips} | {gerr:.1e} | {dist:.1e} |")
        print(lines[-1], flush=True)
    name = f"peer-kinks-{args.model}-{args.optimizer}{'-same' if args.same_params else ''}.md"
    data = "the peer harness's random batches"
    print(f"wrote {common.write_text(out / name, chr(10).join(lines), data)}")


if __name__ == "__main__":
    main()
