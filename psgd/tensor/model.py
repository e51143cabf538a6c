"""A model split over the ranks of one tensor (or spatial) group, with its own local flat vectors.

Each rank holds a local flat parameter vector and its map ``index`` into the serial
model's flat vector.  A parameter is ``"split"`` (this rank's slice), ``"replicated"``
(every rank holds it and computes the same gradient) or ``"partial"`` (every rank holds
it and computes part of its gradient: one all-reduce after backward completes it); a layer's
``select(name, index)`` gives its part of a serial parameter and the kind (or an array of
kinds, one per element, where a parameter mixes them).
"""
from __future__ import annotations

import copy

import numpy as np

from psgd.kernels.loss import softmax_cross_entropy
from psgd.nn.elementwise import Dropout
from psgd.nn.model import Model
from psgd.tensor import primitives as pr

KINDS = ("split", "replicated", "partial")


def _select(layer, name, index):
    select = getattr(layer, "select", None)
    return select(name, index) if select is not None else (index, "replicated")


class TensorModel:
    """The split layers of ``serial`` (a :class:`psgd.nn.model.Model`) on ``comm``.

    ``split(layers, comm)`` makes the parallel layers from copies of ``serial.layers``
    (:func:`psgd.tensor.dense.split_dense_chain`, :func:`psgd.tensor.spatial.split_spatial`),
    so the serial model keeps its own.
    """

    def __init__(self, serial: Model, split, comm) -> None:
        layers = split(copy.deepcopy(serial.layers), comm)
        self.serial, self.layers, self.comm = serial, layers, comm
        self.dtype = serial.dtype
        full = {(i, name): np.arange(lo, hi) for i, name, lo, hi in serial.param_ranges}
        shapes = {(i, n): s for i, layer in enumerate(serial.layers) for n, s in layer.param_shapes()}
        source = self._sources(serial)
        pieces, kinds, views = [], [], []
        for j, layer in enumerate(layers):
            for name, shape in layer.param_shapes():
                i = source[j]
                idx, kind = _select(layer, name, full[i, name].reshape(shapes[i, name]))
                if idx.shape != tuple(shape):
                    raise AssertionError(f"{layer}: {name} selects {idx.shape}, expected {shape}")
                views.append((j, name, sum(p.size for p in pieces), shape))
                pieces.append(idx.reshape(-1))
                code = np.vectorize(KINDS.index, otypes=[np.int8])(kind) if np.ndim(kind) else KINDS.index(kind)
                kinds.append(np.broadcast_to(np.asarray(code, np.int8), idx.shape).reshape(-1))
        self.index = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        kind = np.concatenate(kinds) if kinds else np.zeros(0, np.int8)
        self.owned = (kind == 0) | (comm.Get_rank() == 0)
        self.partial = np.flatnonzero(kind == 2)
        self.n_params = self.index.size
        self.params = serial.params[self.index].astype(self.dtype)
        self.grad = np.zeros(self.n_params, self.dtype)
        self._bind(views)
        self._first = min((j for j, _, _, _ in views), default=0)

    def _sources(self, serial):
        """For each parallel layer with parameters, the serial layer index they come from."""
        with_params = [i for i, layer in enumerate(serial.layers) if layer.param_shapes()]
        mine = [j for j, layer in enumerate(self.layers) if layer.param_shapes()]
        if len(with_params) != len(mine):
            raise AssertionError("a split changed the number of layers with parameters")
        return dict(zip(mine, with_params))

    def _bind(self, views):
        by_layer: dict = {}
        for j, name, start, shape in views:
            n = int(np.prod(shape))
            p, g = by_layer.setdefault(j, ({}, {}))
            p[name] = self.params[start:start + n].reshape(shape)
            g[name] = self.grad[start:start + n].reshape(shape)
        for j, (p, g) in by_layer.items():
            self.layers[j].bind(p, g)

    def reseed(self, *key: int) -> None:
        """As :meth:`psgd.nn.model.Model.reseed`: each dropout layer's masks from (seed, its index
        in the serial model, *key), so a replicated dropout draws what the serial one draws."""
        drops = [layer for layer in self.layers if isinstance(layer, Dropout)]
        serial = [i for i, layer in enumerate(self.serial.layers) if isinstance(layer, Dropout)]
        for layer, i in zip(drops, serial):
            index = i if layer.mask_index is None else layer.mask_index
            layer.reseed([self.serial.seed, index, *map(int, key)])

    def loss_and_grad(self, x, y) -> tuple[float, int]:
        """As :meth:`psgd.nn.model.Model.loss_and_grad`, on this rank's part of the model."""
        x, y = self.serial.check_batch(x, y)
        for layer in self.layers:
            layer.set_mode("train")
        for layer in self.layers:
            x = layer.forward(x)
        dlogits = np.empty(x.shape, self.dtype)
        loss, correct = softmax_cross_entropy(x, y, dlogits)
        dy = dlogits
        for j in range(len(self.layers) - 1, -1, -1):
            dy = self.layers[j].backward(dy, need_dx=j > self._first)
        if self.partial.size:
            self.grad[self.partial] = pr.allreduce_forward(self.grad[self.partial], self.comm)
        return float(loss), int(correct)

    def full_params(self) -> np.ndarray:
        """The serial model's whole flat vector, on every rank of the group (collective)."""
        return self.gather_flat(self.params)

    def gather_flat(self, local: np.ndarray) -> np.ndarray:
        """A vector laid out as :attr:`params` (the parameters, an optimizer's state) as the
        serial model's whole flat vector, on every rank of the group (collective)."""
        full = np.zeros(self.serial.n_params, local.dtype)
        full[self.index[self.owned]] = local[self.owned]
        return pr.allreduce_forward(full, self.comm)

    def split_flat(self, full: np.ndarray) -> np.ndarray:
        """This rank's part of a whole flat vector (the adjoint layout of :meth:`gather_flat`)."""
        return full[self.index]

    def param_bytes(self) -> int:
        """Bytes of this rank's parameters."""
        return int(self.params.nbytes)
