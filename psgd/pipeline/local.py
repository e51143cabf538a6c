"""A stage's own part of a model: only layers ``[a, b)`` get parameters and gradients.

The parameters are drawn as the whole model's are (one generator through every layer
in order); the layers before the stage are drawn and dropped a block at a time
(:func:`psgd.nn.draw.param_draws`), so a rank holds only its stage.
"""
from __future__ import annotations

import numpy as np

from psgd.nn.draw import param_draws
from psgd.nn.model import Model, _walk, model_layers
from psgd.nn.elementwise import Dropout
from psgd.nn.norm import BatchNorm


def layer_params(layer) -> int:
    """The number of parameters of ``layer``."""
    return sum(int(np.prod(shape)) for _, shape in layer.param_shapes())


class StageModel(Model):
    """The :class:`psgd.nn.model.Model` of stage ``[a, b)``: :attr:`params` and :attr:`grad`
    hold that stage's slice of the flat vector only (``offset`` is where it starts in it).

    ``layers`` is the whole list, so layer indices are the model's; layers outside the
    stage are never bound and hold nothing.  ``n_total`` is the whole model's parameter
    count.
    """

    def __init__(self, spec: str, a: int, b: int, seed: int = 0, dtype=np.float32,
                 input_shape: tuple | None = None, n_classes: int | None = None) -> None:
        layers, shape, classes = model_layers(spec, seed, input_shape, n_classes)
        self.spec, self.seed, self.layers, self.a, self.b = spec.strip(), int(seed), layers, a, b
        self.input_shape, self.n_classes = tuple(shape), int(classes)
        self.dtype = np.dtype(dtype)
        self._n_features = int(np.prod(self.input_shape))
        sizes = [layer_params(layer) for layer in layers]
        self.n_total, self.offset = sum(sizes), sum(sizes[:a])
        self.param_ranges = []
        offset = 0
        for i in range(a, b):
            for name, shape_ in layers[i].param_shapes():
                size = int(np.prod(shape_))
                self.param_ranges.append((i, name, offset, offset + size))
                offset += size
        self.n_params = offset
        self._params = np.zeros(offset, self.dtype)
        self._grad = np.zeros(offset, self.dtype)
        self._bind()
        self._first_param_layer = min((i for i, n in enumerate(sizes) if n), default=0)
        rng = np.random.default_rng(seed)
        _skip(spec, seed, input_shape, n_classes, a, self.dtype, rng)
        for layer in layers[a:b]:
            layer.init_params(rng)
        self._dlogits = None
        self.batchnorms = [p for p in _walk(layers[a:b]) if isinstance(p, BatchNorm)]
        self.any_batchnorm = any(isinstance(p, BatchNorm) for p in _walk(layers))
        self.stochastic = any(isinstance(p, Dropout) for p in _walk(layers[a:b]))
        self._calibration = None

    def _bind(self) -> None:
        views = {i: ({}, {}) for i in range(self.a, self.b)}
        shapes = {(i, name): s for i in range(self.a, self.b)
                  for name, s in self.layers[i].param_shapes()}
        for i, name, lo, hi in self.param_ranges:
            views[i][0][name] = self._params[lo:hi].reshape(shapes[i, name])
            views[i][1][name] = self._grad[lo:hi].reshape(shapes[i, name])
        for i in range(self.a, self.b):
            self.layers[i].bind(*views[i])

    def __repr__(self) -> str:
        return f"StageModel({self.spec!r}, layers {self.a}..{self.b - 1}, n_params={self.n_params})"


def _skip(spec, seed, input_shape, n_classes, a: int, dtype, rng) -> None:
    """Advance ``rng`` past the draws of layers ``[0, a)``, their values dropped block by block."""
    for layer in model_layers(spec, seed, input_shape, n_classes)[0][:a]:
        for _ in param_draws(layer, rng, dtype):
            pass


def stage_model(settings, info: dict, a: int, b: int) -> StageModel:
    """Stage ``[a, b)`` of ``--model`` on the data described by ``info``."""
    return StageModel(settings.model, a, b, seed=settings.seed, input_shape=info["input_shape"],
                      n_classes=info["n_classes"])
