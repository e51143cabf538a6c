"""One stage: its layers' forward and backward per microbatch, their inputs kept until the backward."""
from __future__ import annotations

import numpy as np

SWAP_CHUNK = 1 << 14   # values exchanged at a time between the weights and a stashed version


class Stage:
    """Layers ``[a, b)`` of ``model``; parameters ``model.params[lo:hi]``.

    Every layer keeps the state of its last forward only (psgd's layers reuse their
    buffers), so a stage stores each in-flight microbatch's *input* and, when the
    layers last ran another microbatch, runs the forward again before the backward
    (GPipe's re-materialisation).  The recomputed forward is the same arithmetic, so
    the gradients are those a single process computes.  With ``keep`` an
    :class:`~psgd.pipeline.activations.ActivationStore` holds each in-flight
    microbatch's layer state instead, and no forward runs twice.

    Attributes
    ----------
    acc : (hi - lo,) model dtype
        The sum of this batch's microbatch gradients, in backward order.
    peak_inputs : int
        The most microbatch inputs held at once.
    """

    def __init__(self, model, a: int, b: int, first: bool, last: bool, stash: bool = False,
                 keep: bool = False) -> None:
        from psgd.pipeline.activations import ActivationStore
        self.model, self.a, self.b = model, a, b
        self.store = ActivationStore(model, a, b) if keep else None
        self.stash = stash                     # weight stashing (PipeDream): see :meth:`backward`
        self._stashed: dict[int, np.ndarray] = {}
        self._on_current: set[int] = set()     # forwards that ran on the then-current weights
        self.weights_for = None                # vertical sync: m -> the slice's version for m
        self.predict = None                    # PipeMare: weights -> the backward's weights
        self.keep_read = False                 # keep :attr:`read` (a --stage-comp method reads it)
        self.read = None                       # the last backward's weights (None: the current)
        self.first, self.last = first, last
        ranges = [(lo, hi) for i, _, lo, hi in model.param_ranges if a <= i < b]
        self.lo = min((lo for lo, _ in ranges), default=0)
        self.hi = max((hi for _, hi in ranges), default=0)
        self.acc = np.zeros(self.hi - self.lo, model.dtype)
        self.inputs: dict[int, tuple] = {}
        self.peak_inputs = 0
        self.input_bytes = 0
        self._live: int | None = None
        self._first_dx = model._first_param_layer if first else -1

    @property
    def params(self) -> np.ndarray:
        return self.model.params[self.lo:self.hi]

    @property
    def activation_bytes(self) -> int:
        """The most bytes of stored microbatch inputs, plus the store's layer buffers."""
        held = self.store.peak_bytes if self.store is not None else 0
        return self.peak_inputs * self.input_bytes + held

    def begin_batch(self) -> None:
        self.acc[:] = 0.0

    def forward(self, m: int, x: np.ndarray, key: tuple, y: np.ndarray | None = None):
        """Run microbatch ``m``: the output activation, or on the last stage (loss, correct).

        With :attr:`weights_for` (vertical sync) the forward runs on ``weights_for(m)``,
        an older version of the slice, and the current weights are put back after it.
        """
        self.inputs[m] = (x, y, key)
        self.peak_inputs = max(self.peak_inputs, len(self.inputs))
        self.input_bytes = max(self.input_bytes, x.nbytes)
        older = self.weights_for(m) if self.weights_for is not None else None
        if self.stash:
            self._stashed[m] = self.params.copy() if older is None else older
        if older is None:
            self._on_current.add(m)
            return self._run(m)
        current = self.params.copy()
        self.params[:] = older
        out = self._run(m)
        self.params[:] = current
        return out

    def _run(self, m: int):
        x, y, key = self.inputs[m]
        model = self.model
        if model.stochastic:
            model.reseed(*key)
        if self.store is not None:
            self.store.begin()
        for layer in model.layers[self.a:self.b]:
            layer.set_mode("train")
            x = layer.forward(x)
        self._live = m
        out = model._loss(x, y) if self.last else x
        if self.store is not None:
            self.store.keep(m)
        return out

    def backward(self, m: int, dy: np.ndarray | None) -> np.ndarray | None:
        """Microbatch ``m``'s backward from ``dy`` (the last stage: from its loss); adds its
        parameter gradient to :attr:`acc` and returns the input's gradient (None on stage 0).

        With :attr:`stash` the backward (and its recomputed forward) runs on the weights
        microbatch ``m``'s forward used; with :attr:`predict` on ``predict(params)``
        (PipeMare's estimate of them): their values and the current ones trade places for
        the backward and trade back after it, so no third copy is made.
        """
        stashed = self._stashed.pop(m) if self.stash else None
        unchanged = self._live == m and m in self._on_current   # no step since its forward
        self._on_current.discard(m)
        if stashed is None and self.predict is not None:
            stashed = self.predict(self.params)
            if stashed is not None:   # the forward is run again, on the predicted weights
                unchanged, self._live = False, None
        swapped = stashed is not None and not unchanged
        if swapped:
            _swap(self.params, stashed)
        kept = self.store is not None and self.store.restore(m)
        if self._live != m and not kept:
            self._run(m)
        if self.last:
            dy = self.model._dlogits
        layers = self.model.layers
        for i in range(self.b - 1, self.a - 1, -1):
            dy = layers[i].backward(dy, need_dx=i > self._first_dx)
        np.add(self.acc, self.model.grad[self.lo:self.hi], out=self.acc)
        del self.inputs[m]
        if self.store is not None:
            self.store.release(m)
        self._live = None
        if swapped:
            _swap(self.params, stashed)
        self.read = stashed if swapped and self.keep_read else None
        return None if self.first else dy


def _swap(a: np.ndarray, b: np.ndarray, chunk: int = SWAP_CHUNK) -> None:
    """Exchange the values of the vectors ``a`` and ``b`` ``chunk`` values at a time."""
    for i in range(0, a.size, chunk):
        held = a[i:i + chunk].copy()
        a[i:i + chunk] = b[i:i + chunk]
        b[i:i + chunk] = held
