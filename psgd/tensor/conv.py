"""Conv layers split by channels under --tensor (filter parallelism), paired like dense layers.

A column conv computes a slice of the output channels from the replicated input (its
backward all-reduces the input gradient); the next conv takes those channels as its
input slice and all-reduces its partial sums, adding the replicated bias once after the
sum.  Between the two, ReLU, pooling and batch norm act on the local channels (batch
norm's statistics are per channel, so local).  A column conv left without a partner
all-gathers its channels before the first layer that needs them all.  A residual block is
split inside (:func:`channel_residual`).
"""
from __future__ import annotations

import numpy as np

from psgd.nn.layers import AvgPool2D, Conv2D, Elementwise, Layer, MaxPool2D
from psgd.nn.norm import BatchNorm
from psgd.nn.residual import Residual
from psgd.tensor import primitives as pr
from psgd.tensor.dense import check_width, split_dense_chain
from psgd.tensor.residual import SplitResidual


def _channels_first(x):
    return np.ascontiguousarray(np.moveaxis(x, -1, 0))


def _channels_last(x):
    return np.ascontiguousarray(np.moveaxis(x, 0, -1))


def _conv(conv: Conv2D, in_shape: tuple, filters: int) -> Conv2D:
    return Conv2D(in_shape, filters, (conv.kh, conv.kw), conv.stride, conv.pad, winograd=conv.winograd)


class ColumnConv(Layer):
    """Output channels [c0, c1) of ``conv`` from the replicated input; its backward all-reduces
    the input gradient, unless ``reduce_dx`` is False (the caller sums it with another first)."""

    def __init__(self, conv: Conv2D, comm, reduce_dx: bool = True) -> None:
        super().__init__()
        self.reduce_dx = reduce_dx
        f = conv.out_shape[2]
        check_width(f, comm.Get_size(), f"{conv}'s filters")
        self.comm, self.sizes = comm, pr.split_sizes(f, comm.Get_size())
        self.c0, self.c1 = pr.split_bounds(f, comm.Get_size(), comm.Get_rank())
        self.inner = _conv(conv, conv.in_shape, self.c1 - self.c0)
        self.parts = [self.inner]   # walked into (psgd.nn.model._walk): the activation store's
        self.in_shape, self.out_shape = conv.in_shape, self.inner.out_shape

    def param_shapes(self):
        return self.inner.param_shapes()

    def select(self, name, shape):
        return slice(None), slice(self.c0, self.c1), "split"

    def bind(self, params, grads):
        self.inner.bind(params, grads)

    def forward(self, x):
        return self.inner.forward(pr.copy_forward(x, self.comm))

    def backward(self, dy, need_dx=True):
        dx = self.inner.backward(np.ascontiguousarray(dy), need_dx)
        return pr.copy_adjoint(dx, self.comm) if need_dx and self.reduce_dx else dx


class RowConv(Layer):
    """``conv`` on input channels [r0, r1): partial sums all-reduced, then the bias added once."""

    def __init__(self, conv: Conv2D, comm) -> None:
        super().__init__()
        h, w, c = conv.in_shape
        check_width(c, comm.Get_size(), f"{conv}'s input channels")
        self.comm, self.kh, self.kw, self.c = comm, conv.kh, conv.kw, c
        self.r0, self.r1 = pr.split_bounds(c, comm.Get_size(), comm.Get_rank())
        self.inner = _conv(conv, (h, w, self.r1 - self.r0), conv.out_shape[2])
        self.parts = [self.inner]   # walked into (psgd.nn.model._walk): the activation store's
        self.in_shape, self.out_shape = self.inner.in_shape, conv.out_shape
        self.own = np.zeros(0)

    def param_shapes(self):
        return self.inner.param_shapes()

    def select(self, name, shape):
        rows = np.arange(shape[0] - 1)                # the weights' rows: (kh, kw, channel) flattened
        rows = rows[(rows % self.c >= self.r0) & (rows % self.c < self.r1)]
        kind = ["split"] * rows.size + ["replicated"]  # the bias row, added once after the sum
        return np.append(rows, shape[0] - 1), slice(None), kind

    def bind(self, params, grads):
        self.wb, self.dwb = params["wb"], grads["wb"]
        self.own = np.zeros_like(self.wb)     # the weights with a zero bias row, for the kernel
        self.own_grad = np.zeros_like(self.dwb)
        self.inner.bind({"wb": self.own}, {"wb": self.own_grad})

    def forward(self, x):
        self.own[:-1] = self.wb[:-1]
        out = pr.allreduce_forward(self.inner.forward(x), self.comm)
        out += self.wb[-1]
        return out

    def backward(self, dy, need_dx=True):
        dy = pr.allreduce_adjoint(np.ascontiguousarray(dy), self.comm)
        self.own[:-1] = self.wb[:-1]   # the weights now (a kept forward's, or a stashed version)
        dx = self.inner.backward(dy, need_dx)
        self.dwb[:-1] = self.own_grad[:-1]
        self.dwb[-1] = dy.reshape(-1, dy.shape[-1]).sum(axis=0)
        return dx


class GatherChannels(Layer):
    """Local channels -> all channels on every rank; backward keeps the local ones."""

    def __init__(self, sizes: list, shape: tuple, comm) -> None:
        super().__init__()
        self.comm, self.sizes = comm, sizes
        self.in_shape, self.out_shape = (*shape[:-1], sizes[comm.Get_rank()]), tuple(shape)

    def forward(self, x):
        return _channels_last(pr.allgather_forward(_channels_first(x), self.comm, self.sizes))

    def backward(self, dy, need_dx=True):
        return _channels_last(pr.allgather_adjoint(_channels_first(dy), self.comm, self.sizes)) if need_dx else None


class LocalBatchNorm(BatchNorm):
    """Batch norm on the local channels [c0, c1) of a column conv's output."""

    def __init__(self, bn: BatchNorm, shape: tuple, c0: int, c1: int) -> None:
        super().__init__(shape, bn.eps, bn.relu)
        self.c0, self.c1 = c0, c1

    def select(self, name, shape):
        return slice(None), slice(self.c0, self.c1), "split"


def channel_residual(block: Residual, comm) -> SplitResidual:
    """``block`` split by channels: its first conv column-parallel with its batch norm and ReLU
    on the local channels, the second conv row-parallel (one all-reduce each way), the second
    batch norm replicated. A projection shortcut is column-parallel on the same channels as
    the first conv, its batch norm local, its output all-gathered before the add; the two
    column convs' partial input gradients are summed and all-reduced once."""
    conv1, bn1, relu, conv2, bn2 = block.main
    col = ColumnConv(conv1, comm, reduce_dx=not block.shortcut)
    main = [col, LocalBatchNorm(bn1, (*bn1.in_shape[:-1], col.c1 - col.c0), col.c0, col.c1), relu,
            RowConv(conv2, comm), bn2]
    if not block.shortcut:
        return SplitResidual(main, [], block.in_shape, block.out_shape)
    proj, bn = block.shortcut
    pcol = ColumnConv(proj, comm, reduce_dx=False)
    shortcut = [pcol, LocalBatchNorm(bn, pcol.out_shape, pcol.c0, pcol.c1),
                GatherChannels(pcol.sizes, proj.out_shape, comm)]
    return SplitResidual(main, shortcut, block.in_shape, block.out_shape,
                         reduce=lambda dx: pr.copy_adjoint(dx, comm))


def split_conv_channels(layers: list, comm, close: bool = False) -> list:
    """Pair the conv layers of ``layers`` column-then-row over ``comm``, and split residual
    blocks inside (:func:`channel_residual`); dense layers are left for
    :func:`psgd.tensor.dense.split_dense_chain`.  ``close``: a column conv still open at the
    end gathers its channels there (a pipeline stage's output is whole)."""
    out, split = [], None        # split: the column conv whose channels the layers now carry
    for layer in layers:
        if isinstance(layer, Residual):
            if split is not None:
                out.append(GatherChannels(split.sizes, layer.in_shape, comm))
                split = None
            out.append(channel_residual(layer, comm))
        elif isinstance(layer, Conv2D):
            if split is None:
                split = ColumnConv(layer, comm)
                out.append(split)
            else:
                out.append(RowConv(layer, comm))
                split = None
        elif split is None or isinstance(layer, Elementwise):
            out.append(layer)
        elif isinstance(layer, BatchNorm):
            out.append(LocalBatchNorm(layer, (*layer.in_shape[:-1], split.c1 - split.c0), split.c0, split.c1))
        elif isinstance(layer, (MaxPool2D, AvgPool2D)):
            out.append(type(layer)((*layer.in_shape[:-1], split.c1 - split.c0), layer.k, layer.stride))
        else:
            out += [GatherChannels(split.sizes, layer.in_shape, comm), layer]
            split = None
    if close and split is not None:
        out.append(GatherChannels(split.sizes, layers[-1].out_shape, comm))
    return out


def split_tensor(layers: list, comm, close: bool = False) -> list:
    """Everything --tensor splits: conv channels, then the dense chain (``close``: as
    :func:`split_conv_channels`); over one rank, the serial layers themselves."""
    if comm.Get_size() == 1:
        return list(layers)
    return split_dense_chain(split_conv_channels(layers, comm, close), comm)
