"""A model split over the ranks of one tensor (or spatial) group: each rank draws, holds,
trains and evaluates only its own part, never the whole model.

A parameter of the serial model is seen as (rows, columns) (:func:`psgd.nn.draw.as_rows`).
A split layer's ``select(name, shape)`` gives its part of serial parameter ``name`` of that
shape as ``(rows, columns, kind)``: the rows a slice or sorted indices, the columns a slice,
the kind ``"split"`` (this rank's own values), ``"replicated"`` (every rank holds them and
computes the same gradient) or ``"partial"`` (every rank holds them and computes part of
the gradient: one all-reduce after backward completes it), one kind or one per row.
The parameters are drawn layer by layer in row blocks (:mod:`psgd.nn.draw`), so each rank's
part is bit-equal to those values of the serial model's draw.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.nn.draw import DRAW_VALUES, as_rows, param_draws
from psgd.nn.elementwise import Dropout
from psgd.nn.model import Model, _walk, model_layers
from psgd.nn.norm import BatchNorm
from psgd.tensor import primitives as pr

KINDS = ("split", "replicated", "partial")


class Piece:
    """Local parameter ``name`` of split layer ``layer``: rows ``rows`` and columns [c0, c1) of
    serial parameter ``key`` = (layer index, name), which starts at ``lo`` of the serial flat
    vector, seen as (``n_rows``, ``n_cols``); its values start at ``start`` of the local
    vector, row by row; ``kinds``: one code per local row."""

    def __init__(self, key: tuple, layer: int, lo: int, shape: tuple, part: tuple, start: int) -> None:
        self.key, self.layer, self.name = key, layer, key[1]
        self.lo, (self.n_rows, self.n_cols), self.start = lo, shape, start
        rows, cols, kind = part
        self.rows = np.arange(self.n_rows)[rows] if isinstance(rows, slice) else np.asarray(rows, np.int64)
        self.c0, self.c1, _ = cols.indices(self.n_cols)
        codes = np.vectorize(KINDS.index, otypes=[np.int8])(kind) if np.ndim(kind) else KINDS.index(kind)
        self.kinds = np.broadcast_to(np.asarray(codes, np.int8), self.rows.shape)
        self.width = self.c1 - self.c0
        self.size = self.rows.size * self.width

    def blocks(self, values: int, own: bool = False):
        """Row ranges [r0, r1) of about ``values`` values each, over the whole serial parameter
        or (``own``) over the span of this rank's rows."""
        a, b = (int(self.rows[0]), int(self.rows[-1]) + 1) if own else (0, self.n_rows)
        step = max(1, values // self.n_cols)
        for r0 in range(a, b, step):
            yield r0, min(b, r0 + step)

    def _mine(self, r0: int, r1: int) -> tuple[int, int]:
        return tuple(np.searchsorted(self.rows, [r0, r1]))

    def take(self, r0: int, block: np.ndarray, out: np.ndarray) -> None:
        """Copy this rank's values of serial rows [r0, r0 + len(block)) into the local ``out``."""
        a, b = self._mine(r0, r0 + len(block))
        dest = out[self.start + a * self.width:self.start + b * self.width].reshape(b - a, self.width)
        dest[...] = block[self.rows[a:b] - r0, self.c0:self.c1]

    def put(self, local: np.ndarray, r0: int, block: np.ndarray, lead: bool) -> None:
        """Write the local values of serial rows [r0, r0 + len(block)) that this rank owns (its
        split rows; every row on the ``lead`` rank) into ``block``."""
        a, b = self._mine(r0, r0 + len(block))
        values = local[self.start + a * self.width:self.start + b * self.width].reshape(b - a, self.width)
        keep = slice(None) if lead else self.kinds[a:b] == 0
        block[self.rows[a:b][keep] - r0, self.c0:self.c1] = values[keep]


def _pieces(layers, serial_at: dict, source: dict) -> list:
    """Each local parameter's :class:`Piece`, in local (and serial) order."""
    pieces, start = [], 0
    for j, layer in enumerate(layers):
        for name, shape in layer.param_shapes():
            lo, whole = serial_at[source[j], name]
            select = getattr(layer, "select", None)
            part = select(name, whole) if select is not None else (slice(None), slice(None), "replicated")
            piece = Piece((source[j], name), j, lo, whole, part, start)
            if (piece.rows.size, piece.width) != as_rows(shape):
                raise AssertionError(f"{layer}: {name} selects {(piece.rows.size, piece.width)}, "
                                     f"expected {as_rows(shape)}")
            pieces.append(piece)
            start += piece.size
    return pieces


class TensorModel(Model):
    """Model ``spec`` (as :func:`psgd.nn.model.build_model` takes it) split by ``split(layers,
    comm)`` (:func:`psgd.tensor.conv.split_tensor`, :func:`psgd.tensor.spatial.split_spatial`).

    :attr:`params` and :attr:`grad` hold this rank's part only; ``n_total`` is the serial
    model's parameter count.  ``span`` (a, b): only the serial layers [a, b) are split and
    held (a tensor-split pipeline stage, :mod:`psgd.tensor.pipeline`); default all.  ``loss_and_grad``, ``evaluate`` and ``predict`` are the
    serial model's, run through the parts: collective over ``comm``.
    """

    def __init__(self, spec: str, split, comm, seed: int = 0, dtype=np.float32,
                 input_shape: tuple | None = None, n_classes: int | None = None,
                 draw_values: int = DRAW_VALUES, span: tuple | None = None) -> None:
        serial, shape, classes = model_layers(spec, seed, input_shape, n_classes)
        self.span = tuple(span) if span is not None else (0, len(serial))
        self.spec, self.seed, self.serial_layers, self.comm = spec.strip(), int(seed), serial, comm
        self.input_shape, self.n_classes, self.dtype = tuple(shape), int(classes), np.dtype(dtype)
        self._n_features, self.draw_values = int(np.prod(self.input_shape)), draw_values
        serial_at, offset = {}, 0
        for i, layer in enumerate(serial):
            for name, s in layer.param_shapes():
                serial_at[i, name] = (offset, as_rows(s))
                offset += int(np.prod(s))
        self.n_total = offset
        self.layers = split(list(serial[self.span[0]:self.span[1]]), comm)
        self.pieces = _pieces(self.layers, serial_at, self._sources())
        self.param_ranges = [(p.layer, p.name, p.start, p.start + p.size) for p in self.pieces]
        self.n_params = sum(p.size for p in self.pieces)
        self._params, self._grad = np.zeros(self.n_params, self.dtype), np.zeros(self.n_params, self.dtype)
        self._bind()
        self._first_param_layer = min((p.layer for p in self.pieces), default=0)
        self._draw()
        self.partial = np.concatenate([np.zeros(0, np.int64)] + [
            p.start + np.flatnonzero(np.repeat(p.kinds == 2, p.width)) for p in self.pieces])
        self._dlogits, self._calibration = None, None
        self.batchnorms = [p for p in _walk(self.layers) if isinstance(p, BatchNorm)]
        self.stochastic = any(isinstance(p, Dropout) for p in _walk(self.layers))

    def _sources(self) -> dict:
        """For each parallel layer with parameters, the serial layer index they come from."""
        with_params = [i for i in range(*self.span) if self.serial_layers[i].param_shapes()]
        mine = [j for j, layer in enumerate(self.layers) if layer.param_shapes()]
        if len(with_params) != len(mine):
            raise AssertionError("a split changed the number of layers with parameters")
        return dict(zip(mine, with_params))

    def _draw(self) -> None:
        """Draw the serial model's parameters layer by layer, keeping this rank's (the layers
        outside :attr:`span` are drawn and dropped)."""
        by_key = {p.key: p for p in self.pieces}
        rng = np.random.default_rng(self.seed)
        for i, layer in enumerate(self.serial_layers[:self.span[1]]):
            for name, r0, block in param_draws(layer, rng, self.dtype, self.draw_values):
                if (i, name) in by_key:
                    by_key[i, name].take(r0, block, self._params)

    def __repr__(self) -> str:
        return f"TensorModel({self.spec!r}, part {self.comm.Get_rank()} of {self.comm.Get_size()}, " \
               f"n_params={self.n_params} of {self.n_total})"

    def reseed(self, *key: int) -> None:
        """As :meth:`psgd.nn.model.Model.reseed`: each dropout layer's masks from (seed, its index
        in the serial model, *key), so a replicated dropout draws what the serial one draws."""
        drops = [layer for layer in self.layers if isinstance(layer, Dropout)]
        serial = [i for i in range(*self.span) if isinstance(self.serial_layers[i], Dropout)]
        for layer, i in zip(drops, serial):
            index = i if layer.mask_index is None else layer.mask_index
            layer.reseed([self.seed, index, *map(int, key)])

    def loss_and_grad(self, x, y) -> tuple[float, int]:
        """As :meth:`psgd.nn.model.Model.loss_and_grad`, on this rank's part of the model."""
        loss, correct = super().loss_and_grad(x, y)
        if self.partial.size:
            self._grad[self.partial] = pr.allreduce_forward(self._grad[self.partial], self.comm)
        return loss, correct

    def take_flat(self, read, dtype=None) -> np.ndarray:
        """This rank's part of a vector laid out as the serial flat vector, where ``read(lo, hi)``
        gives its values [lo, hi) (a slice of a checkpoint's dataset), read in row blocks."""
        out = np.zeros(self.n_params, dtype or self.dtype)
        for p in self.pieces:
            for r0, r1 in p.blocks(self.draw_values, own=True):
                p.take(r0, np.asarray(read(p.lo + r0 * p.n_cols, p.lo + r1 * p.n_cols)).reshape(r1 - r0, -1), out)
        return out

    def owned_blocks(self, local: np.ndarray):
        """Yield ``(lo, hi, block)``: serial flat range [lo, hi) with the values of ``local`` (laid
        out as :attr:`params`) that this rank owns, zeros elsewhere; over the ranks of ``comm``
        each value is owned once, so the blocks' sum is the serial vector."""
        lead = self.comm.Get_rank() == 0
        for p in self.pieces:
            for r0, r1 in p.blocks(self.draw_values):
                block = np.zeros((r1 - r0, p.n_cols), local.dtype)
                p.put(local, r0, block, lead)
                yield p.lo + r0 * p.n_cols, p.lo + r1 * p.n_cols, block.reshape(-1)

    def gather_flat(self, local: np.ndarray) -> np.ndarray | None:
        """``local`` (laid out as :attr:`params`: the parameters, an optimizer's state) as the
        serial model's whole flat vector on rank 0 of ``comm``, None elsewhere (collective)."""
        root = self.comm.Get_rank() == 0
        full = np.zeros(self.n_total, local.dtype) if root else None
        for lo, hi, block in self.owned_blocks(local):
            request = self.comm.Ireduce(block, full[lo:hi] if root else None, MPI.SUM, root=0)
            pr.wait(request, "rank 0 to gather the parts of a flat vector")
        return full

    def param_bytes(self) -> int:
        """Bytes of this rank's parameters."""
        return int(self._params.nbytes)
