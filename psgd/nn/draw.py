"""A model's initial parameters drawn one layer at a time, in row blocks and in flat order,
consuming the generator exactly as :class:`psgd.nn.model.Model` does, so that a part of a
model can be drawn without ever holding the whole of it (or the whole of a wide layer)."""
from __future__ import annotations

import copy

import numpy as np

from psgd.nn.layers import Conv2D, Dense, weight_draws
from psgd.nn.residual import Residual

DRAW_VALUES = 1 << 20   # values per draw of a wide layer: 8 MiB of float64


def as_rows(shape: tuple) -> tuple[int, int]:
    """A parameter's shape as the (rows, columns) it is drawn and split by; a vector is one row."""
    shape = tuple(int(n) for n in shape)
    return (1, shape[0]) if len(shape) == 1 else (shape[0], int(np.prod(shape[1:])))


def param_draws(layer, rng: np.random.Generator, dtype=np.float32, values: int = DRAW_VALUES):
    """Yield ``(name, row0, block)`` for every parameter of ``layer`` in flat order: ``block``
    holds rows ``[row0, row0 + len(block))`` of the parameter seen as :func:`as_rows`, at most
    about ``values`` values each for dense and conv weights.  ``rng`` advances as
    ``layer.init_params(rng)`` advances it, and the values, cast to ``dtype``, are what that
    call writes into a model of that dtype."""
    if isinstance(layer, Dense):
        n_in, n_out = layer.in_shape[0], layer.out_shape[0]
        for r0, block in weight_draws((n_in, n_out), n_out, n_in, n_out, layer.init, rng, values // n_out):
            yield ("w", r0, block) if r0 < n_in else ("b", 0, block)
    elif isinstance(layer, Conv2D):
        rows, f = layer.kh * layer.kw * layer.in_shape[2], layer.out_shape[2]
        fan_out = layer.kh * layer.kw * f
        for r0, block in weight_draws((rows, f), f, rows, fan_out, layer.init, rng, values // f):
            yield "wb", r0, block
    elif isinstance(layer, Residual):
        for i, part in enumerate(layer.parts):
            for name, r0, block in param_draws(part, rng, dtype, values):
                yield f"{i}.{name}", r0, block
    elif layer.param_shapes():   # any other layer: drawn whole, into a copy's own scratch
        shapes = layer.param_shapes()
        scratch = copy.deepcopy(layer)
        views = {name: np.zeros(shape, dtype) for name, shape in shapes}
        scratch.bind(views, {name: np.zeros(shape, dtype) for name, shape in shapes})
        scratch.init_params(rng)
        for name, shape in shapes:
            yield name, 0, views[name].reshape(as_rows(shape))
