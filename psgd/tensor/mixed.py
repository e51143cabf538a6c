"""`--grid auto`: each layer of the model split its own way over the group (Gholami et al.'s
integrated choice), batch-parallel up to a cut and tensor-parallel after it.

The group reads one batch.  The layers before the cut run on this rank's samples
(:class:`SplitBatch`, whose adjoint all-gathers), with replicated weights whose gradients
are partial sums (one all-reduce completes them) and batch norms whose sums are
all-reduced; :class:`GatherBatch` all-gathers the samples at the cut; the layers after it
are split by :func:`psgd.tensor.conv.split_tensor`.  :func:`choose_cut` costs every cut's
collectives with a price the caller gives (`psgd plan`'s alpha-beta model, psgd.run.grid_cost;
computation is divided by the group in every case) and takes the cheapest.
"""
from __future__ import annotations

import numpy as np

from psgd.nn.elementwise import Dropout
from psgd.nn.layers import Layer
from psgd.nn.norm import BatchNorm
from psgd.nn.residual import Residual
from psgd.tensor import primitives as pr
from psgd.tensor.conv import ColumnConv, GatherChannels, RowConv, split_tensor
from psgd.tensor.dense import ColumnDense, RowDense
from psgd.tensor.residual import SplitResidual
from psgd.tensor.spatial import GatherHeight, PartialWeights, SpatialBatchNorm, SpatialWindow, height_split

class SplitBatch(Layer):
    """Replicated (B, ...) -> this rank's samples; backward all-gathers them."""

    def __init__(self, shape: tuple, comm) -> None:
        super().__init__()
        self.comm, self.in_shape, self.out_shape = comm, tuple(shape), tuple(shape)

    def _sizes(self, n: int) -> list:
        return pr.split_sizes(n, self.comm.Get_size())

    def forward(self, x):
        self._n = x.shape[0]
        return np.ascontiguousarray(pr.split_forward(x, self.comm, self._sizes(x.shape[0])))

    def backward(self, dy, need_dx=True):
        return pr.split_adjoint(dy, self.comm, self._sizes(self._n)) if need_dx else None


class GatherBatch(SplitBatch):
    """This rank's samples -> the replicated batch; backward keeps this rank's samples."""

    def forward(self, x):
        self._n = int(pr.allreduce_forward(np.array([x.shape[0]], np.int64), self.comm)[0])
        return pr.allgather_forward(x, self.comm, self._sizes(self._n))

    def backward(self, dy, need_dx=True):
        return np.ascontiguousarray(pr.allgather_adjoint(dy, self.comm, self._sizes(self._n))) \
            if need_dx else None


class OnSamples(PartialWeights):
    """A serial layer with parameters run on this rank's samples."""

    def __init__(self, layer) -> None:
        super().__init__()
        self.inner, self.in_shape, self.out_shape = layer, layer.in_shape, layer.out_shape

    def set_mode(self, mode):
        super().set_mode(mode)
        self.inner.set_mode(mode)

    def forward(self, x):
        return self.inner.forward(x)

    def backward(self, dy, need_dx=True):
        return self.inner.backward(dy, need_dx)


class SampleDropout(Dropout):
    """A dropout on this rank's samples whose masks are the serial ones: it draws the whole
    batch's mask from the same stream and keeps this rank's rows of it."""

    def __init__(self, layer: Dropout, source: SplitBatch) -> None:
        super().__init__(layer.in_shape, layer.p)
        self.mask_index, self.source = layer.mask_index, source

    def _mask(self, size: int) -> np.ndarray:
        n, comm, width = self.source._n, self.source.comm, int(np.prod(self.in_shape))
        lo = sum(self.source._sizes(n)[:comm.Get_rank()]) * width
        return super()._mask(n * width)[lo:lo + size]


def on_samples(layer, comm, source: SplitBatch):
    """``layer`` run on this rank's samples (``source`` split them): batch norms with the
    group's sums, dropout with the serial masks, a residual block with its parts so, other
    layers with parameters as :class:`OnSamples`."""
    if isinstance(layer, BatchNorm):
        return SpatialBatchNorm(layer, layer.in_shape, comm)
    if isinstance(layer, Dropout):
        return SampleDropout(layer, source)
    if isinstance(layer, Residual):
        parts = [on_samples(p, comm, source) for p in layer.parts]
        return SplitResidual(parts[:len(layer.main)], parts[len(layer.main):], layer.in_shape, layer.out_shape)
    return OnSamples(layer) if layer.param_shapes() else layer


def split_mixed(layers: list, comm, cut: int, head: str = "batch") -> list:
    """Layers [0, cut) on this rank's samples (``head`` batch) or on its rows of every image
    (spatial: :func:`psgd.tensor.spatial.height_split` stopped at the cut, the rows gathered
    there), the rest split by :func:`split_tensor`; ValueError where the head cannot split so.
    A group of one rank (T = 1) runs the serial layers themselves: on its one rank every split
    is the identity, and the serial kernels (batch norm's above all) are faster than the
    split layers' numpy."""
    if comm.Get_size() == 1:
        return list(layers)
    if head == "spatial":
        split, stop = height_split(layers, comm, stop=cut)
        if stop != cut or cut == len(layers):
            raise ValueError(f"the height split stops at layer {stop}, not at the cut {cut}")
        return split[:len(split) - (len(layers) - cut)] + split_tensor(list(layers[cut:]), comm)
    if cut == 0:
        return split_tensor(list(layers), comm)
    source = SplitBatch(layers[0].in_shape, comm)
    head = [source] + [on_samples(layer, comm, source) for layer in layers[:cut]]
    return head + [GatherBatch(layers[cut - 1].out_shape, comm)] + split_tensor(list(layers[cut:]), comm)


def _collectives(layer, first: bool) -> list:
    """(kind, values per sample or per step) of the collectives one step of split ``layer``
    runs: ("all-reduce" | "all-gather" | "halo", values, per_sample); a halo's values are an
    array, row q the values part q sends part q + 1 and part q + 1 sends part q."""
    size = lambda shape: int(np.prod(shape))  # noqa: E731
    if isinstance(layer, SplitResidual):
        out = [c for part in layer.parts for c in _collectives(part, False)]
        return out + ([("all-reduce", size(layer.in_shape), True)] if layer.reduce else [])
    if isinstance(layer, (ColumnDense, ColumnConv)):
        out = [] if first or not getattr(layer, "reduce_dx", True) else [("all-reduce", size(layer.in_shape), True)]
        return out + ([("all-gather", size(layer.out_shape), True)] if getattr(layer, "gather", False) else [])
    if isinstance(layer, (RowDense, RowConv)):
        return [("all-reduce", size(layer.out_shape), True)]
    if isinstance(layer, (GatherChannels, GatherBatch)):
        return [("all-gather", size(layer.out_shape), True)]
    if isinstance(layer, GatherHeight):
        return [("all-gather", size(layer.out_shape), True)]
    if isinstance(layer, SpatialWindow):   # the halo forward (and its adjoint), the weights' sum
        rows = np.array([[layer.lo[q + 1], layer.hi[q]] for q in range(len(layer.lo) - 1)])
        halo = [("halo", rows * size(layer.in_shape[1:]), True)]     # forward: [q] q -> q+1, q+1 -> q
        halo += [] if first else [("halo", rows[:, ::-1] * size(layer.in_shape[1:]), True)]  # adjoint
        return halo + ([("all-reduce", sum(size(s) for _, s in layer.param_shapes()), False)]
                       if layer.param_shapes() else [])
    if isinstance(layer, OnSamples):
        return [("all-reduce", sum(size(s) for _, s in layer.param_shapes()), False)]
    if isinstance(layer, SpatialBatchNorm):
        return [("all-reduce", 0, False)] * 2
    return []


def step_seconds(split: list, batch: int, itemsize: int, price) -> float:
    """Seconds of the collectives of one step of the ``split`` layers within the group, each
    priced by ``price(kind, nbytes)`` (kind ``all-reduce``, ``all-gather``, or ``halo`` with
    per-neighbour bytes as :func:`_collectives` gives them)."""
    total, first = 0.0, True
    for layer in split:
        for kind, values, per_sample in _collectives(layer, first):
            total += price(kind, values * itemsize * (batch if per_sample else 1))
        first = first and not layer.param_shapes()
    return total


def local_values(split: list) -> int:
    """Parameters this rank holds of the ``split`` layers (what the replicas all-reduce)."""
    return sum(int(np.prod(shape)) for layer in split for _, shape in layer.param_shapes())


def choose_cut(layers: list, comm, batch: int, itemsize: int, price, replicas: int = 1) -> tuple[int, list]:
    """(the cut of the cheapest :func:`split_mixed`, every cut's seconds; None where the tensor
    part cannot split); ties go to the later cut (fewer split layers).  A cut's seconds are
    its group's collectives and, over ``replicas`` > 1, the all-reduce of this rank's
    gradient across them (``price("replica all-reduce", nbytes)``)."""
    costs = []
    for cut in range(len(layers) + 1):
        try:
            split = split_mixed(layers, comm, cut)
        except ValueError:
            costs.append(None)
            continue
        across = price("replica all-reduce", local_values(split) * itemsize) if replicas > 1 else 0.0
        costs.append(step_seconds(split, batch, itemsize, price) + across)
    best = min(c for c in costs if c is not None)
    return max(i for i, c in enumerate(costs) if c == best), costs
