"""Each in-flight microbatch's layer state on a stage, kept from its forward to its backward.

psgd's layers write into their own buffers and remember their last forward only.  The
store gives every in-flight microbatch its own set of layer buffers, and saves the
arrays and flags a forward leaves on its layers; the backward puts them back, so it
needs no second forward (``--recompute off``: memory for time).
"""
from __future__ import annotations

import numpy as np

from psgd.nn.model import _walk


def _state(layer) -> dict:
    """What a forward left on ``layer``: its private arrays and flags (not its buffer dict)."""
    return {k: v for k, v in vars(layer).items()
            if k.startswith("_") and k != "_bufs" and isinstance(v, (np.ndarray, bool))}


class ActivationStore:
    """Layers ``[a, b)`` of ``model``: :meth:`begin` before a forward, :meth:`keep` after it,
    :meth:`restore` before its backward, :meth:`release` after it.

    Attributes
    ----------
    peak_bytes : int
        The most bytes of layer buffers the store owned at once (its buffer sets, held
        or free).
    """

    def __init__(self, model, a: int, b: int) -> None:
        self.model = model
        self.layers = list(_walk(model.layers[a:b]))
        self._free: list[list[dict]] = []
        self._held: dict[int, tuple] = {}
        self._sets = None
        self.peak_bytes = 0

    def begin(self) -> None:
        """Point the layers at a buffer set no held microbatch uses."""
        self._sets = self._free.pop() if self._free else [{} for _ in self.layers] + [{}]
        for layer, bufs in zip(self.layers, self._sets):
            layer._bufs = bufs
        self.model._dlogits = self._sets[-1].get("dlogits")

    def keep(self, m: int) -> None:
        """Microbatch ``m``'s forward has run: hold its buffers and layer state."""
        self._sets[-1]["dlogits"] = self.model._dlogits
        self._held[m] = (self._sets, [_state(layer) for layer in self.layers])
        self._measure()

    def restore(self, m: int) -> bool:
        """Put microbatch ``m``'s state back on the layers; False when none is held."""
        if m not in self._held:
            return False
        self._sets, states = self._held[m]
        for layer, bufs, state in zip(self.layers, self._sets, states):
            layer._bufs = bufs
            vars(layer).update(state)
        self.model._dlogits = self._sets[-1].get("dlogits")
        return True

    def release(self, m: int) -> None:
        """Microbatch ``m``'s backward is done: its buffer set is free again."""
        sets, _ = self._held.pop(m)
        self._free.append(sets)
        self._measure()

    def _measure(self) -> None:
        owned = [sets for sets, _ in self._held.values()] + self._free
        total = sum(buf.nbytes for sets in owned for bufs in sets for buf in bufs.values()
                    if buf is not None)
        self.peak_bytes = max(self.peak_bytes, total)
