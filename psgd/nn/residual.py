"""The basic residual block of He et al. (2016): two 3x3 convolutions with batch norm, and a shortcut."""
from __future__ import annotations

import numpy as np

from psgd.kernels.activation import relu_backward
from psgd.kernels.residual import accumulate, add_relu_forward
from psgd.nn.layers import Conv2D, Layer, ReLU
from psgd.nn.norm import BatchNorm


class Residual(Layer):
    """``relu(bn(conv3x3(relu(bn(conv3x3_s(x))))) + shortcut(x))`` on channels-last (H, W, C).

    The shortcut is the identity when the shape is kept (stride 1, C == filters), else a
    1x1 convolution with the block's stride followed by batch norm (ResNet option B).
    Parameters are those of the parts, in order (main branch, then shortcut), named
    ``"<part index>.<name>"``.
    """

    def __init__(self, in_shape: tuple, filters: int, stride: int = 1) -> None:
        super().__init__()
        c = in_shape[2]
        conv1 = Conv2D(in_shape, filters, 3, stride=stride, pad=1)
        bn1 = BatchNorm(conv1.out_shape)
        conv2 = Conv2D(conv1.out_shape, filters, 3, stride=1, pad=1)
        self.main = [conv1, bn1, ReLU(bn1.out_shape, inplace=True), conv2, BatchNorm(conv2.out_shape)]
        self.shortcut: list[Layer] = []
        if stride != 1 or c != filters:
            proj = Conv2D(in_shape, filters, 1, stride=stride, pad=0)
            self.shortcut = [proj, BatchNorm(proj.out_shape)]
        self.parts = self.main + self.shortcut
        self.in_shape, self.out_shape = tuple(in_shape), conv2.out_shape

    def param_shapes(self):
        return [(f"{i}.{name}", shape) for i, part in enumerate(self.parts)
                for name, shape in part.param_shapes()]

    def bind(self, params, grads):
        for i, part in enumerate(self.parts):
            names = [name for name, _ in part.param_shapes()]
            part.bind({n: params[f"{i}.{n}"] for n in names}, {n: grads[f"{i}.{n}"] for n in names})

    def init_params(self, rng):
        for part in self.parts:
            part.init_params(rng)

    def set_mode(self, mode):
        super().set_mode(mode)
        for part in self.parts:
            part.set_mode(mode)

    def forward(self, x):
        a = x
        for part in self.main:
            a = part.forward(a)
        b = x
        for part in self.shortcut:
            b = part.forward(b)
        out = self._buf("out", a.shape, a.dtype)
        add_relu_forward(a.reshape(-1), np.ascontiguousarray(b).reshape(-1), out.reshape(-1))
        self._out = out
        return out

    def backward(self, dy, need_dx=True):
        g = self._buf("g", dy.shape, dy.dtype)
        relu_backward(self._out.reshape(-1), np.ascontiguousarray(dy).reshape(-1), g.reshape(-1))
        d = g
        for part in reversed(self.main):
            d = part.backward(d, need_dx=need_dx or part is not self.main[0])
        s = g
        for part in reversed(self.shortcut):
            s = part.backward(s, need_dx=need_dx or part is not self.shortcut[0])
        if not need_dx:
            return None
        accumulate(d.reshape(-1), s.reshape(-1))
        return d
