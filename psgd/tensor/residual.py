"""A residual block with split parts: the block's own forward and backward, which add the
shortcut once to the main branch's output (after the second conv's all-reduce under
--tensor, on the rank's own rows under --spatial), and may complete the input gradient with
one collective; ``select`` asks the part that holds a parameter."""
from __future__ import annotations

from psgd.nn.layers import Layer
from psgd.nn.residual import Residual


class SplitResidual(Residual):
    """:class:`psgd.nn.residual.Residual` on split ``main`` and ``shortcut`` parts (the serial
    block's parameter names, ``"<part index>.<name>"``, are kept)."""

    def __init__(self, main: list, shortcut: list, in_shape: tuple, out_shape: tuple,
                 reduce=None) -> None:
        Layer.__init__(self)
        self.main, self.shortcut, self.reduce = main, shortcut, reduce
        self.parts = main + shortcut
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)

    def select(self, name, shape):
        index, _, inner = name.partition(".")
        select = getattr(self.parts[int(index)], "select", None)
        return select(inner, shape) if select is not None else (slice(None), slice(None), "replicated")

    def backward(self, dy, need_dx=True):
        """The block's backward; ``reduce``, when given, completes the summed input gradient of
        the two branches (their partial sums, under --tensor with a projection)."""
        dx = super().backward(dy, need_dx)
        return self.reduce(dx) if need_dx and self.reduce is not None else dx
