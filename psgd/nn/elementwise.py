"""Elementwise layers beside ReLU: leaky ReLU, tanh, sigmoid and seeded dropout (off outside training)."""
from __future__ import annotations

import numpy as np

from psgd.kernels.activation import (leaky_relu_backward, leaky_relu_forward, sigmoid_backward,
                                     sigmoid_forward, tanh_backward, tanh_forward)
from psgd.kernels.dropout import dropout_backward, dropout_forward
from psgd.nn.layers import Elementwise, Layer


class LeakyReLU(Elementwise):
    """``x if x > 0 else alpha * x`` (0 < alpha < 1)."""

    def __init__(self, shape: tuple, alpha: float = 0.01, inplace: bool = False) -> None:
        super().__init__(shape, inplace)
        self.alpha = float(alpha)

    def _fwd(self, x, out):
        leaky_relu_forward(x, self.alpha, out)

    def _bwd(self, out, dy, dx):
        leaky_relu_backward(out, self.alpha, dy, dx)


class Tanh(Elementwise):
    """``tanh(x)``."""

    def _fwd(self, x, out):
        tanh_forward(x, out)

    def _bwd(self, out, dy, dx):
        tanh_backward(out, dy, dx)


class Sigmoid(Elementwise):
    """``1 / (1 + exp(-x))``."""

    def _fwd(self, x, out):
        sigmoid_forward(x, out)

    def _bwd(self, out, dy, dx):
        sigmoid_backward(out, dy, dx)


class Dropout(Layer):
    """Inverted dropout with drop probability ``p`` in training; the identity otherwise.

    The mask comes from ``numpy.random.Generator(seed)``; :meth:`reseed` starts a new
    stream from a key (the model passes its seed, the layer's index, the worker and the
    step), so a run's masks do not depend on where it was resumed.  ``mask_index``, when
    set, is the layer index that key uses (the spec builder's, which fused layers do not shift).
    """

    mask_index: int | None = None

    def __init__(self, shape: tuple, p: float, seed=0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.in_shape = self.out_shape = tuple(shape)
        self.p = float(p)
        self.reseed(seed)

    def reseed(self, key) -> None:
        """Draw the following masks from a fresh generator seeded with ``key`` (int or ints)."""
        self._rng = np.random.default_rng(key)

    def forward(self, x):
        self._active = self.mode == "train" and self.p > 0
        if not self._active:
            return x
        self._u = self._mask(x.size)
        out = self._buf("out", x.shape, x.dtype)
        dropout_forward(np.ascontiguousarray(x).reshape(-1), self._u, self.p, out.reshape(-1))
        return out

    def _mask(self, size: int) -> np.ndarray:
        """The next ``size`` uniforms of the stream, which the mask compares with ``p``."""
        u = self._buf("u", (size,), np.float32)
        self._rng.random(dtype=np.float32, out=u)
        return u

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return None
        if not self._active:
            return dy
        dx = self._buf("dx", dy.shape, dy.dtype)
        dropout_backward(np.ascontiguousarray(dy).reshape(-1), self._u, self.p, dx.reshape(-1))
        return dx
