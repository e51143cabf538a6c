"""A ``--tensor`` part's step, timed: one of two parts of the split model
(:class:`psgd.tensor.model.TensorModel`) on a stand-in communicator whose collectives
complete at once, against the share the serial units give it; for the planner's tensor rows
(the split layers' wrappers, copies and Python per layer, which the serial units do not run)."""
from __future__ import annotations

import time

import numpy as np

PARTS = 2        # the part count timed


class _Done:
    def Test(self) -> bool:
        return True


class Alone:
    """Rank 0 of ``parts`` whose collectives complete at once (the others add zeros)."""

    def __init__(self, parts: int = PARTS) -> None:
        self.parts = parts

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return self.parts

    def Iallreduce(self, send, recv, op):
        recv[0][...] = send[0]
        return _Done()

    def Iallgatherv(self, send, recv):
        out, (counts, displs), _ = recv
        flat = out.reshape(-1)
        flat[:] = 0
        flat[displs[0]:displs[0] + counts[0]] = send[0].reshape(-1)
        return _Done()


def split_ratio(model, units, batch: int, repeats: int = 3) -> float:
    """A part's training step at ``batch`` (best of ``repeats`` after a warm-up) over the units'
    share of it (split units' forward and backward / PARTS, the others whole)."""
    from psgd.tensor.conv import split_tensor
    from psgd.tensor.model import TensorModel
    part = TensorModel(model.spec, split_tensor, Alone(), input_shape=model.input_shape,
                       n_classes=model.n_classes)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *part.input_shape)).astype(part.dtype)
    y = np.arange(batch) % part.n_classes
    best = np.inf
    for _ in range(repeats + 1):           # the first compiles
        t = time.perf_counter()
        part.loss_and_grad(x, y)
        best = min(best, time.perf_counter() - t)
    share = sum((u.forward_at(batch) + u.backward_at(batch)) / (PARTS if u.split_bytes else 1)
                for u in units)
    return float(best / share)
