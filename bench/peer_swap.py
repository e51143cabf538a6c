"""Which side's defaults make the gap: psgd and PyTorch trained on the same batches, each from its own
default init and from the other's, evaluated both ways (psgd's precise BN and torch's running stats).

    .venv/bin/python bench/peer_swap.py --data FILE --model cifar-cnn --epochs 2
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from peer_torch_train import evaluate, load  # noqa: E402

from psgd.nn.model import CALIBRATION_SAMPLES, build_model  # noqa: E402
from psgd.nn.optim import make_optimizer  # noqa: E402
from psgd.nn.torch_peer import TorchPeer  # noqa: E402


def run(args, data, framework: str, init: str) -> list:
    """Test accuracy after each epoch: [(psgd-style evaluation, torch eval mode)]."""
    x, y, xt, yt, classes = data
    model = build_model(args.model, seed=args.seed, input_shape=x.shape[1:], n_classes=classes)
    model.set_calibration(x[:CALIBRATION_SAMPLES])
    torch.manual_seed(args.seed)
    peer = TorchPeer(model)
    if init == "psgd":
        peer.load(model.params)
    else:
        model.params = peer.flat()
    opt = make_optimizer("momentum", model.n_params, momentum=0.9)
    topt = torch.optim.SGD(peer.net.parameters(), lr=args.lr, momentum=0.9)
    txt, tyt = torch.from_numpy(xt), torch.from_numpy(yt)
    out, b, step = [], args.batch_size, 0
    for epoch in range(args.epochs):
        order = np.random.default_rng([args.seed, epoch]).permutation(len(y))
        for s in range(0, len(y) - b + 1, b):
            idx = order[s:s + b]
            if framework == "psgd":
                model.reseed(0, step)
                model.loss_and_grad(x[idx], y[idx])
                opt.step(model.params, model.grad, args.lr)
            else:
                loss = torch.nn.functional.cross_entropy(peer.net(torch.from_numpy(x[idx])),
                                                         torch.from_numpy(y[idx]))
                topt.zero_grad()
                loss.backward()
                topt.step()
            step += 1
        if framework == "psgd":
            peer.load(model.params)   # torch eval mode needs running stats: psgd has none
            out.append((model.evaluate(xt, yt)[1], None))
        else:
            model.params = peer.flat()
            out.append((model.evaluate(xt, yt)[1], evaluate(peer.net, txt, tyt)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="cifar-cnn")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    common.add_output_arguments(ap)
    args = ap.parse_args()
    out = common.out_dir(args, "peer-swap")
    torch.set_num_threads(2)
    data = load(args.data)
    lines = [f"{args.model} on {args.data}: {len(data[1])} train, {len(data[3])} test rows; "
             f"momentum 0.9, lr {args.lr}, batch {args.batch_size}, seed {args.seed}", "",
             "| trained by | init | epoch | test acc (precise BN) | test acc (torch eval mode) |",
             "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for framework, init in (("psgd", "psgd"), ("psgd", "torch"), ("torch", "torch"), ("torch", "psgd")):
        for epoch, (acc, tacc) in enumerate(run(args, data, framework, init), 1):
            t = "" if tacc is None else f"{tacc:.4f}"
            lines.append(f"| {framework} | {init} | {epoch} | {acc:.4f} | {t} |")
            print(lines[-1], flush=True)
    print(f"wrote {common.write_text(out / 'peer-swap.md', chr(10).join(lines), args.data)}")

if __name__ == "__main__":
    main()
