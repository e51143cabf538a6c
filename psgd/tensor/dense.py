"""Megatron-style dense layers: column-parallel (outputs split) then row-parallel (inputs split).

A column layer copies its replicated input (its backward all-reduces the input
gradient); a row layer all-reduces its partial products forward and adds the
replicated bias once, after the sum, so its gradient is the same on every rank and is
never reduced.  A column layer left without a partner all-gathers its output.
Parameter kinds (see :class:`psgd.tensor.model.TensorModel`): ``"split"`` for a rank's
own slice, ``"replicated"`` for a value every rank holds with an identical gradient.
"""
from __future__ import annotations

import numpy as np

from psgd.kernels.dense import dense_backward_input, dense_backward_params, dense_forward
from psgd.nn.layers import Dense, Elementwise, Layer
from psgd.tensor import primitives as pr


def check_width(width: int, parts: int, what: str) -> None:
    """Refuse a split that would leave a rank with nothing of a layer."""
    if parts > width:
        raise ValueError(f"--tensor {parts} is larger than {what} allows ({width} wide); "
                         f"use --tensor {width} or less")


class ColumnDense(Layer):
    """``y[:, cols] = x @ w[:, cols] + b[cols]`` on this rank's output columns (uneven allowed).

    ``gather``: all-gather the output (the layer has no row-parallel partner), whose
    backward keeps this rank's columns of the replicated gradient.
    """

    def __init__(self, dense: Dense, comm, gather: bool = False) -> None:
        super().__init__()
        n_in, n_out = dense.in_shape[0], dense.out_shape[0]
        check_width(n_out, comm.Get_size(), f"dense layer {n_in}->{n_out}")
        self.comm, self.relu, self.gather = comm, dense.relu, gather
        self.sizes = pr.split_sizes(n_out, comm.Get_size())
        self.c0, self.c1 = pr.split_bounds(n_out, comm.Get_size(), comm.Get_rank())
        self.in_shape = dense.in_shape
        self.out_shape = dense.out_shape if gather else (self.c1 - self.c0,)

    def param_shapes(self):
        return [("w", (self.in_shape[0], self.c1 - self.c0)), ("b", (self.c1 - self.c0,))]

    def select(self, name, shape):
        return slice(None), slice(self.c0, self.c1), "split"

    def bind(self, params, grads):
        self.w, self.b, self.dw, self.db = params["w"], params["b"], grads["w"], grads["b"]

    def forward(self, x):
        self._x = x = pr.copy_forward(x, self.comm)
        out = self._buf("out", (x.shape[0], self.c1 - self.c0), x.dtype)
        self._out = dense_forward(x, self.w, self.b, out, self.relu)
        if not self.gather:
            return out
        return np.ascontiguousarray(pr.allgather_forward(out.T, self.comm, self.sizes).T)

    def backward(self, dy, need_dx=True):
        if self.gather:
            dy = pr.allgather_adjoint(dy.T, self.comm, self.sizes).T
        dy = np.ascontiguousarray(dy) if self.gather else self._own(dy)
        dense_backward_params(self._x, dy, self.dw, self.db, self._out if self.relu else None)
        if not need_dx:
            return None
        dx = dense_backward_input(self.w, dy, self._buf("dx", self._x.shape, dy.dtype))
        return pr.copy_adjoint(dx, self.comm)

    def _own(self, dy):
        if dy.flags.c_contiguous and dy.flags.writeable:
            return dy
        own = self._buf("dy", dy.shape, dy.dtype)
        own[...] = dy
        return own


class RowDense(Layer):
    """``y = allreduce(x[:, rows] @ w[rows]) + b`` on this rank's input rows; ``b`` replicated."""

    def __init__(self, dense: Dense, comm) -> None:
        super().__init__()
        n_in, n_out = dense.in_shape[0], dense.out_shape[0]
        check_width(n_in, comm.Get_size(), f"dense layer {n_in}->{n_out}")
        self.comm, self.relu = comm, dense.relu
        self.r0, self.r1 = pr.split_bounds(n_in, comm.Get_size(), comm.Get_rank())
        self.in_shape, self.out_shape = (self.r1 - self.r0,), dense.out_shape

    def param_shapes(self):
        return [("w", (self.r1 - self.r0, self.out_shape[0])), ("b", self.out_shape)]

    def select(self, name, shape):
        if name == "w":
            return slice(self.r0, self.r1), slice(None), "split"
        return slice(None), slice(None), "replicated"

    def bind(self, params, grads):
        self.w, self.b, self.dw, self.db = params["w"], params["b"], grads["w"], grads["b"]

    def forward(self, x):
        self._x = x
        out = pr.allreduce_forward(x @ self.w, self.comm)
        out += self.b
        if self.relu:
            np.maximum(out, 0, out=out)
        self._out = out
        return out

    def backward(self, dy, need_dx=True):
        dy = pr.allreduce_adjoint(dy, self.comm)
        if self.relu:
            dy = np.where(self._out > 0, dy, 0).astype(dy.dtype)
        self.db[...] = dy.sum(axis=0)
        np.dot(self._x.T, dy, self.dw)
        if not need_dx:
            return None
        return np.dot(dy, self.w.T)


def split_dense_chain(layers: list, comm) -> list:
    """Pair the Dense layers of ``layers`` column-then-row; a Dense left alone gathers.

    Two Dense layers with only elementwise activations between them form a pair; other
    layers are kept as they are (replicated).
    """
    out, i = [], 0
    while i < len(layers):
        layer = layers[i]
        if not isinstance(layer, Dense):
            out.append(layer)
            i += 1
            continue
        j = i + 1
        while j < len(layers) and isinstance(layers[j], Elementwise):
            j += 1                       # an activation between the two acts on split features
        if j < len(layers) and isinstance(layers[j], Dense):
            out += [ColumnDense(layer, comm), *layers[i + 1:j], RowDense(layers[j], comm)]
            i = j + 1
        else:
            out.append(ColumnDense(layer, comm, gather=True))
            i += 1
    return out
