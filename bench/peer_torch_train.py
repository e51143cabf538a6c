"""The PyTorch side of the peer benchmark: the same network trained with torch's own defaults on the same HDF5 file."""
from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from psgd.data.reader import ShardReader
from psgd.nn.model import build_model
from psgd.nn.torch_peer import TorchPeer


def load(path: str) -> tuple:
    """Train and test arrays, float32 with the file's scaling and normalisation (as psgd reads them)."""
    reader = ShardReader(path, 0, 1, 1)
    x, y = reader.calibration_rows(reader.n_local)   # every row (in a seeded order), as floats
    xt, yt = reader.test_set()
    return x, y, xt, yt, reader.n_classes


def crop_flip(x: torch.Tensor, g: torch.Generator, pad: int) -> torch.Tensor:
    """Random crop of the zero-padded image and a left-right flip half the time (torchvision's
    RandomCrop(padding=pad) + RandomHorizontalFlip, written out: torchvision is not installed)."""
    b, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    offs = torch.randint(0, 2 * pad + 1, (b, 2), generator=g)
    flips = torch.rand(b, generator=g) < 0.5
    out = torch.empty_like(x)
    for i in range(b):
        r, s = int(offs[i, 0]), int(offs[i, 1])
        crop = padded[i, :, r:r + h, s:s + w]
        out[i] = crop.flip(-1) if flips[i] else crop
    return out


def evaluate(net, xt: torch.Tensor, yt: torch.Tensor) -> float:
    net.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(yt), 256):
            correct += int((net(xt[s:s + 256]).argmax(1) == yt[s:s + 256]).sum())
    net.train()
    return correct / len(yt)


def evaluate_precise(net, xt: torch.Tensor, yt: torch.Tensor, calib: torch.Tensor) -> float:
    """The test accuracy with batch-norm statistics recomputed as psgd computes them (precise
    BN: the population mean and variance of ``calib``'s rows under the current parameters, no
    dropout), the running statistics restored afterwards."""
    bns = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return evaluate(net, xt, yt)
    saved = [(m.running_mean.clone(), m.running_var.clone(), m.momentum) for m in bns]
    net.eval()
    for m in bns:
        m.reset_running_stats()
        m.momentum = None   # a cumulative average: one batch of all the rows gives their statistics
        m.train()
    with torch.no_grad():
        net(calib)
    acc = evaluate(net, xt, yt)
    for m, (mean, var, momentum) in zip(bns, saved):
        m.running_mean.copy_(mean)
        m.running_var.copy_(var)
        m.momentum = momentum
    return acc


def _run(rank: int, world: int, cfg: dict, data, out) -> None:
    """One process of the torch run (rank 0 of 1, or one of ``world`` DDP ranks on gloo)."""
    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(cfg["seed"])   # the same default init on every rank, as DDP broadcasts
    x, y, xt, yt, classes = data
    model = build_model(cfg["model"], input_shape=x.shape[1:], n_classes=classes)
    net = TorchPeer(model).net   # torch's default init; psgd's parameters are not loaded
    if world > 1:
        net = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
    x, y, xt, yt = map(torch.from_numpy, (x, y, xt, yt))
    g = torch.Generator().manual_seed(cfg["seed"] * 1000 + rank)   # each rank its own draws
    b, pad = cfg["batch_size"], max(1, x.shape[2] // 8)
    calib = x[torch.randperm(len(y), generator=torch.Generator().manual_seed(cfg["seed"]))[:512]]
    for epoch in range(cfg["epochs"]):
        # DistributedSampler's split: one global permutation per epoch, rank r takes r::world
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(cfg["seed"] + epoch))[rank::world]
        t0 = time.perf_counter()
        for s in range(0, len(perm) - b + 1, b):
            idx = perm[s:s + b]
            xb = crop_flip(x[idx], g, pad) if cfg["augment"] else x[idx]
            loss = torch.nn.functional.cross_entropy(net(xb), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        seconds = time.perf_counter() - t0
        if rank == 0:   # the bare module: DDP's forward broadcasts the BN buffers, a collective
            plain = net.module if world > 1 else net   # that rank 1 would never join (a hang)
            out.put((epoch + 1, evaluate(plain, xt, yt), evaluate_precise(plain, xt, yt, calib),
                     (len(perm) // b) * b * world / seconds))
    if world > 1:
        dist.barrier()


def _ddp_entry(rank: int, world: int, port: int, cfg: dict, data, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _run(rank, world, cfg, data, out)
    finally:
        dist.destroy_process_group()


def train_torch(path: str, model: str, *, ranks: int, epochs: int, batch_size: int, lr: float,
                momentum: float, seed: int, augment: bool, port: int = 29517) -> list[dict]:
    """Per-epoch ``{"epoch", "test_acc", "test_acc_precise", "samples_per_s"}`` of torch on ``ranks`` processes (DDP on gloo
    when 2 or more, one thread each; one process with 2 threads otherwise)."""
    cfg = dict(model=model, epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum, seed=seed,
               augment=augment, threads=2 if ranks == 1 else 1)
    data = load(path)
    ctx = mp.get_context("spawn")
    out = ctx.Queue() if ranks > 1 else _ListQueue()
    if ranks == 1:
        _run(0, 1, cfg, data, out)
    else:
        mp.start_processes(_ddp_entry, args=(ranks, port, cfg, data, out), nprocs=ranks, start_method="spawn")
    recs = [out.get() for _ in range(epochs)]
    return [{"epoch": e, "test_acc": a, "test_acc_precise": p, "samples_per_s": r}
            for e, a, p, r in recs]


class _ListQueue(list):
    put = list.append

    def get(self):
        return self.pop(0)
