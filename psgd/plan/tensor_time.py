"""A ``--tensor`` or ``--spatial`` part's step, timed: one part of the split model
(:class:`psgd.tensor.model.TensorModel`) on a stand-in communicator whose collectives and halo
exchanges complete at once, against the share the serial units give it; for the planner's
tensor and spatial rows (the split layers' wrappers, copies, halo slabs, the batch norm's partial
sums and Python per layer, which the serial units do not run)."""
from __future__ import annotations

import time

import numpy as np

PARTS = 2             # the part count the grid rows' ratio is timed at
TIMED = (2, 4, 8)     # the part counts timed; a wider split uses the widest timed at or below it


class _Done:
    def Test(self) -> bool:
        return True


class Alone:
    """Rank ``rank`` of ``parts`` whose collectives complete at once (the others add zeros) and
    whose neighbours' halo rows arrive at once as zeros."""

    def __init__(self, parts: int = PARTS, rank: int = 0) -> None:
        self.parts, self.rank = parts, rank

    def Get_rank(self) -> int:
        return self.rank

    def Get_size(self) -> int:
        return self.parts

    def Iallreduce(self, send, recv, op):
        recv[0][...] = send[0]
        return _Done()

    def Iallgatherv(self, send, recv):
        out, (counts, displs), _ = recv
        flat = out.reshape(-1)
        flat[:] = 0
        at = displs[self.rank]
        flat[at:at + counts[self.rank]] = send[0].reshape(-1)
        return _Done()

    def Isend(self, buf, dest, tag):
        from mpi4py import MPI
        return MPI.Request()          # a null request: complete

    def Irecv(self, buf, source, tag):
        from mpi4py import MPI
        buf[...] = 0
        return MPI.Request()


def part_step(model, split, parts: int, batch: int):
    """A training step at ``batch`` of the part of ``model`` that ``split`` gives a middle rank
    of ``parts`` (rank 1: halos on both sides where it has neighbours), as a callable."""
    from psgd.tensor.model import TensorModel
    part = TensorModel(model.spec, split, Alone(parts, min(1, parts - 1)),
                       input_shape=model.input_shape, n_classes=model.n_classes)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, *part.input_shape)).astype(part.dtype)
    y = np.arange(batch) % part.n_classes
    return lambda: part.loss_and_grad(x, y)


def part_seconds(model, split, parts: int, batch: int, repeats: int = 3) -> float:
    """Best of ``repeats`` (after a warm-up) of :func:`part_step`."""
    step, best = part_step(model, split, parts, batch), np.inf
    for _ in range(repeats + 1):           # the first compiles
        t = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t)
    return float(best)


def tensor_share(units, batch: int, parts: int) -> float:
    """A --tensor part's seconds as the serial units give it: split units over ``parts``."""
    return sum((u.forward_at(batch) + u.backward_at(batch)) / (parts if u.split_bytes else 1)
               for u in units)


def spatial_share(units, lead: int, batch: int, parts: int) -> float:
    """A --spatial part's seconds as the serial units give it: the ``lead`` units' per-sample
    seconds over ``parts``, their per-call seconds and the other units whole."""
    return sum(u.forward_fixed_s + u.backward_fixed_s
               + batch * (u.forward_s + u.backward_s) / (parts if i < lead else 1)
               for i, u in enumerate(units))


def split_ratio(model, units, batch: int, repeats: int = 3, parts: int = PARTS) -> float:
    """A --tensor part's step at ``batch`` over its units' share (:func:`tensor_share`)."""
    from psgd.tensor.conv import split_tensor
    return part_seconds(model, split_tensor, parts, batch, repeats) / tensor_share(units, batch, parts)


def spatial_ratio(model, units, lead: int, batch: int, parts: int, repeats: int = 3) -> float:
    """A --spatial part's step at ``batch`` over its units' share (:func:`spatial_share`)."""
    from psgd.tensor.spatial import split_spatial
    return part_seconds(model, split_spatial, parts, batch, repeats) \
        / spatial_share(units, lead, batch, parts)


def ratio_at(ratios: dict, parts: int, default: float = 1.0) -> float:
    """The ratio timed at ``parts``, else at the widest timed count below it, else ``default``."""
    below = [t for t in ratios if int(t) <= parts]
    return float(ratios[max(below, key=int)]) if below else default
