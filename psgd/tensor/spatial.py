"""Spatial parallelism: conv and pool layers split along the image height, with halo exchange.

Rank r computes output rows ``split_sizes(OH, P)[r]``.  It needs input rows
[o0*s - pad, (o1-1)*s - pad + kh): those outside its own slab come from its neighbours
(the halo), those outside the image are zeros.  The local op then runs with no
padding on an explicitly padded slab.  Conv weights are replicated with a partial
gradient (one all-reduce completes it); batch norm combines its statistics over the group, so its
parameter gradients come out whole.  Before the first layer that needs whole images
(flatten, global pool, dense), or one whose rows would be thinner than its kernel, the slabs
are all-gathered and the rest runs whole; residual blocks are split inside
(:func:`height_residual`).
"""
from __future__ import annotations

import numpy as np

from psgd.kernels.batchnorm import (batchnorm_backward_dx, batchnorm_backward_sums, batchnorm_normalise,
                                    batchnorm_shifted_sums)
from psgd.nn.layers import AvgPool2D, ChannelsLast, Conv2D, Elementwise, Layer, MaxPool2D
from psgd.nn.norm import BatchNorm
from psgd.nn.residual import Residual
from psgd.tensor import primitives as pr
from psgd.tensor.residual import SplitResidual


def _height_first(x):
    return np.ascontiguousarray(np.moveaxis(x, 1, 0))


def _batch_first(x):
    return np.ascontiguousarray(np.moveaxis(x, 0, 1))


class SplitHeight(Layer):
    """Replicated (B, H, W, C) -> this rank's rows; backward all-gathers."""

    def __init__(self, shape: tuple, comm) -> None:
        super().__init__()
        self.comm, self.sizes = comm, pr.split_sizes(shape[0], comm.Get_size())
        self.in_shape = tuple(shape)
        self.out_shape = (self.sizes[comm.Get_rank()], *shape[1:])

    def forward(self, x):
        return _batch_first(pr.split_forward(_height_first(x), self.comm, self.sizes))

    def backward(self, dy, need_dx=True):
        return _batch_first(pr.split_adjoint(_height_first(dy), self.comm, self.sizes)) if need_dx else None


class GatherHeight(SplitHeight):
    """This rank's rows -> replicated whole images; backward keeps this rank's rows."""

    def __init__(self, sizes: list, shape: tuple, comm) -> None:
        Layer.__init__(self)
        self.comm, self.sizes = comm, sizes
        self.in_shape, self.out_shape = (sizes[comm.Get_rank()], *shape[1:]), tuple(shape)

    def forward(self, x):
        return _batch_first(pr.allgather_forward(_height_first(x), self.comm, self.sizes))

    def backward(self, dy, need_dx=True):
        return _batch_first(pr.allgather_adjoint(_height_first(dy), self.comm, self.sizes)) if need_dx else None


class TooThin(ValueError):
    """A layer's rows split over the group would be thinner than its kernel, or its halo deeper
    than a neighbour's rows."""


class PartialWeights(Layer):
    """A layer that runs serial layer ``self.inner`` on part of the data (its rows or its
    samples), so its weight gradient on this rank is a partial sum over the group (kind
    ``partial``)."""

    def param_shapes(self):
        return self.inner.param_shapes()

    def select(self, name, shape):
        return slice(None), slice(None), "partial"

    def bind(self, params, grads):
        self.inner.bind(params, grads)


class SpatialWindow(PartialWeights):
    """A conv or pool layer on this rank's rows; ``in_sizes``: every rank's input rows."""

    def __init__(self, layer, in_sizes: list, comm) -> None:
        super().__init__()
        kh = layer.kh if isinstance(layer, Conv2D) else layer.k
        pad = layer.pad if isinstance(layer, Conv2D) else 0
        h, w, c = layer.in_shape
        oh, ow, f = layer.out_shape
        p, r = comm.Get_size(), comm.Get_rank()
        out_sizes = pr.split_sizes(oh, p)
        self.comm, self.pad, self.out_sizes = comm, pad, out_sizes
        starts = np.concatenate(([0], np.cumsum(in_sizes))).tolist()
        need = []
        for q in range(p):
            o0 = sum(out_sizes[:q])
            a, b = o0 * layer.stride - pad, (o0 + out_sizes[q] - 1) * layer.stride - pad + kh
            need.append((a, b))
            if out_sizes[q] < 1 or in_sizes[q] < kh:
                raise TooThin(f"--spatial {p}: {layer} would leave rank {q} {in_sizes[q]} input rows "
                                 f"of {h} (at least {kh}, the kernel height, needed); use a smaller --spatial")
        self.lo = [max(0, starts[q] - max(a, 0)) for q, (a, b) in enumerate(need)]
        self.hi = [max(0, min(b, h) - starts[q + 1]) for q, (a, b) in enumerate(need)]
        for q in range(p):
            if self.lo[q] > (in_sizes[q - 1] if q else 0) or self.hi[q] > (in_sizes[q + 1] if q + 1 < p else 0):
                raise TooThin(f"--spatial {p}: {layer} needs a halo deeper than a neighbour's "
                                 f"{min(in_sizes)} rows; use a smaller --spatial")
        a, b = need[r]
        self.rows = b - a                        # rows of the padded slab
        self.take = (max(a, 0) - (starts[r] - self.lo[r]), min(b, h) - (starts[r] - self.lo[r]))
        self.at = max(a, 0) - a                  # where the taken rows go in the padded slab
        self.in_shape, self.out_shape = (in_sizes[r], w, c), (out_sizes[r], ow, f)
        slab = (self.rows, w + 2 * pad, c)
        if isinstance(layer, Conv2D):
            self.inner = Conv2D(slab, f, (layer.kh, layer.kw), layer.stride, 0, winograd=False)
        else:
            self.inner = type(layer)(slab, layer.k, layer.stride)
        if self.inner.out_shape[0] != out_sizes[r]:
            raise AssertionError(f"{layer}: slab gives {self.inner.out_shape[0]} rows, not {out_sizes[r]}")

    def forward(self, x):
        ext = pr.halo_forward(_height_first(x), self.comm, self.lo, self.hi)
        n, w, pad = x.shape[0], x.shape[2], self.pad
        slab = self._buf("slab", (n, self.rows, w + 2 * pad, x.shape[3]), x.dtype)
        slab[...] = 0
        t0, t1 = self.take
        slab[:, self.at:self.at + t1 - t0, pad:pad + w] = np.moveaxis(ext[t0:t1], 0, 1)
        return self.inner.forward(slab)

    def backward(self, dy, need_dx=True):
        dslab = self.inner.backward(np.ascontiguousarray(dy), need_dx)
        if not need_dx:
            return None
        r, (t0, t1), pad = self.comm.Get_rank(), self.take, self.pad
        w = dslab.shape[2] - 2 * pad
        dext = np.zeros((self.lo[r] + self.in_shape[0] + self.hi[r], dy.shape[0], w, dslab.shape[3]),
                        dslab.dtype)
        dext[t0:t1] = np.moveaxis(dslab[:, self.at:self.at + t1 - t0, pad:pad + w], 1, 0)
        return _batch_first(pr.halo_adjoint(dext, self.comm, self.lo, self.hi))


class SpatialBatchNorm(BatchNorm):
    """Batch norm over the rows (or samples) of the whole group (train mode): each rank sums
    its own rows (the float32/float64 kernels of :mod:`psgd.kernels.batchnorm`), the group
    combines the sums; in calibrate mode it adds the group's sums, so evaluation uses the
    serial statistics."""

    def __init__(self, bn: BatchNorm, shape: tuple, comm) -> None:
        super().__init__(shape, bn.eps, bn.relu)
        self.comm = comm

    def forward(self, x):
        if self.mode == "eval":
            return super().forward(x)
        c = self.in_shape[-1]
        x2 = np.ascontiguousarray(x).reshape(-1, c)
        mine = self._buf("sums", (1, 1 + 3 * c), np.float64)
        mine[0, 0] = x2.shape[0]
        batchnorm_shifted_sums(x2, mine[0, 1:c + 1], mine[0, c + 1:2 * c + 1], mine[0, 2 * c + 1:])
        n, mean, m2 = group_moments(pr.allgather_forward(mine, self.comm, [1] * self.comm.Get_size()))
        if self.mode == "calibrate":
            self._sum += n * mean
            self._sumsq += m2 + n * mean * mean
            self._count += int(n)
        self._n, self._mean = n, mean
        self._invstd = 1.0 / np.sqrt(np.maximum(m2 / n, 0.0) + self.eps)
        out = self._buf("out", x.shape, x.dtype)
        self._x2, self._o2 = x2, out.reshape(-1, c)
        batchnorm_normalise(x2, self.gamma, self.beta, self._mean, self._invstd, self.relu, self._o2)
        return out

    def backward(self, dy, need_dx=True):
        c = self.in_shape[-1]
        g = np.ascontiguousarray(dy).reshape(-1, c)
        mine = self._buf("dsums", (2 * c,), np.float64)
        batchnorm_backward_sums(g, self._x2, self._mean, self._invstd, self._o2, self.relu, mine[:c], mine[c:])
        sums = pr.allreduce_forward(mine, self.comm)
        self.dbeta[...], self.dgamma[...] = sums[:c], sums[c:]
        if not need_dx:
            return None
        dx = self._buf("dx", dy.shape, dy.dtype)
        batchnorm_backward_dx(g, self._x2, self._mean, self._invstd, self.gamma, self._o2, self.relu,
                              float(self._n), sums[:c], sums[c:], dx.reshape(-1, c))
        return dx


def group_moments(parts: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """(rows, mean, sum of squared deviations) of a batch from its parts' rows (``parts``:
    (P, 1 + 3C), each row count, shift, sum of ``x - shift`` and of its square), combined as
    Chan, Golub and LeVeque's pairwise update does: no part's sums are taken about zero."""
    c = (parts.shape[1] - 1) // 3
    parts = parts[parts[:, 0] > 0]
    n = parts[:, :1]
    shift, s1, s2 = parts[:, 1:c + 1], parts[:, c + 1:2 * c + 1], parts[:, 2 * c + 1:]
    means = shift + s1 / n
    total = float(n.sum())
    mean = (n * means).sum(0) / total
    return total, mean, (s2 - s1 * s1 / n).sum(0) + (n * (means - mean) ** 2).sum(0)


def height_residual(block: Residual, sizes: list, comm) -> tuple[SplitResidual, list]:
    """``block`` split by height (both branches' convs and batch norms on the rank's rows, the
    shortcut added to the same rows) on input rows ``sizes``, and its output rows."""
    r = comm.Get_rank()

    def branch(parts):
        out, rows = [], sizes
        for part in parts:
            if isinstance(part, Conv2D):
                out.append(SpatialWindow(part, rows, comm))
                rows = out[-1].out_sizes
            elif isinstance(part, BatchNorm):
                out.append(SpatialBatchNorm(part, (rows[r], *part.in_shape[1:]), comm))
            else:
                out.append(part)
        return out, rows

    (main, rows), (shortcut, _) = branch(block.main), branch(block.shortcut)
    return SplitResidual(main, shortcut, (sizes[r], *block.in_shape[1:]),
                         (rows[r], *block.out_shape[1:])), rows


def _by_height(layer, sizes: list, shape: tuple, comm):
    """(``layer`` on this rank's rows, every rank's output rows, the whole output shape), or
    None for a layer that needs whole images; :class:`TooThin` when a part is too thin."""
    if isinstance(layer, (Conv2D, MaxPool2D, AvgPool2D)):
        win = SpatialWindow(layer, sizes, comm)
        return win, win.out_sizes, layer.out_shape
    if isinstance(layer, BatchNorm):
        return SpatialBatchNorm(layer, (sizes[comm.Get_rank()], *shape[1:]), comm), sizes, shape
    if isinstance(layer, Residual):
        block, rows = height_residual(layer, sizes, comm)
        return block, rows, layer.out_shape
    if isinstance(layer, Elementwise):
        return layer, sizes, shape
    return None


def height_split(layers: list, comm, stop: int | None = None, begin: bool = False,
                 close: bool = False) -> tuple[list, int]:
    """(the serial ``layers`` of a conv net with their leading conv, pool, BN and residual
    layers split by height; the index of the first serial layer that runs on whole images).

    Splitting stops at the first layer that needs whole images (flatten, global pool, dense),
    whose rows split over ``comm`` would be thinner than its kernel, or at index ``stop``:
    the rows are gathered there and the rest runs whole (replicated) on every rank.
    ``begin``: the input is already an image (H, W, C), split from the first layer on (not
    after a :class:`ChannelsLast`); ``close``: rows still split after the last layer are
    gathered (a pipeline stage's output, :mod:`psgd.tensor.spatial_stages`)."""
    out, sizes, shape = [], None, None
    if begin:
        shape, split = layers[0].in_shape, SplitHeight(layers[0].in_shape, comm)
        out.append(split)
        sizes = split.sizes
    for i, layer in enumerate(layers):
        if sizes is None:
            out.append(layer)
            if isinstance(layer, ChannelsLast):
                shape, split = layer.out_shape, SplitHeight(layer.out_shape, comm)
                out.append(split)
                sizes = split.sizes
            continue
        try:
            part = None if stop is not None and i >= stop else _by_height(layer, sizes, shape, comm)
        except TooThin:
            if not any(isinstance(q, (SpatialWindow, SplitResidual)) for q in out):
                raise                     # not even the first conv splits: refuse
            part = None
        if part is None:
            return out + [GatherHeight(sizes, shape, comm), *layers[i:]], i
        out.append(part[0])
        sizes, shape = part[1], part[2]
    if sizes is None:
        raise ValueError("--spatial needs a model with conv layers (an image input); this one has none")
    return out + ([GatherHeight(sizes, shape, comm)] if close else []), len(layers)


def split_spatial(layers: list, comm) -> list:
    """The serial ``layers`` split by height as far as they go (:func:`height_split`)."""
    return height_split(layers, comm)[0]
