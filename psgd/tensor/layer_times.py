"""Where a split model's training step spends its time, layer by layer: each layer's forward
and backward compute, and the collectives it waits on by kind (psgd.tensor.primitives counts
every wait in ``SPENT``), for the grid's summary."""
from __future__ import annotations

import time

from psgd.tensor import primitives as pr


class LayerTimes:
    """Times the top-level layers of ``model`` inside :meth:`measure` (not evaluation).

    The first measured step (kernels compiling, first touches of memory) is not counted.
    What a step spends outside its layers (the loss, the partial gradients' all-reduce) is
    the row ``after the layers``.
    """

    def __init__(self, model) -> None:
        self.names = [type(layer).__name__ for layer in model.layers]
        self.on, self.steps = False, 0
        self._reset()
        for i, layer in enumerate(model.layers):
            layer.forward = self._timed(i, layer.forward)
            layer.backward = self._timed(i, layer.backward)

    def _reset(self) -> None:
        n = len(self.names) + 1
        self.compute = [0.0] * n
        self.waits: list[dict] = [{} for _ in range(n)]
        self.counted = 0

    def _timed(self, i: int, call):
        def timed(*args, **kwargs):
            if not self.on:
                return call(*args, **kwargs)
            return self._count(i, call, *args, **kwargs)
        return timed

    def _count(self, i: int, call, *args, **kwargs):
        before, t0 = dict(pr.SPENT), time.perf_counter()
        out = call(*args, **kwargs)
        self.compute[i] += time.perf_counter() - t0 - self._waited(i, before)
        return out

    def _waited(self, i: int, before: dict) -> float:
        total = 0.0
        for kind, seconds in pr.SPENT.items():
            delta = seconds - before.get(kind, 0.0)
            if delta:
                self.waits[i][kind] = self.waits[i].get(kind, 0.0) + delta
                total += delta
        return total

    def measure(self, step, *args):
        """``step(*args)`` (the model's ``loss_and_grad``) with its layers timed."""
        if self.steps == 1:
            self._reset()
        inside = self._layer_totals()
        before, t0 = dict(pr.SPENT), time.perf_counter()
        self.on = True
        try:
            out = step(*args)
        finally:
            self.on = False
        seconds = time.perf_counter() - t0
        after = self._layer_totals()
        rest = self.waits[-1]
        for kind, spent in pr.SPENT.items():
            delta = spent - before.get(kind, 0.0) - (after[1].get(kind, 0.0) - inside[1].get(kind, 0.0))
            if delta:
                rest[kind] = rest.get(kind, 0.0) + delta
        waited = sum(pr.SPENT.values()) - sum(before.values())
        self.compute[-1] += seconds - waited - (after[0] - inside[0])
        self.steps += 1
        self.counted += 1
        return out

    def _layer_totals(self) -> tuple[float, dict]:
        """The layers' compute seconds so far, and their waits by kind."""
        kinds: dict = {}
        for waits in self.waits[:-1]:
            for kind, seconds in waits.items():
                kinds[kind] = kinds.get(kind, 0.0) + seconds
        return sum(self.compute[:-1]), kinds

    def report(self) -> list[dict]:
        """Per layer (and ``after the layers``), milliseconds per counted step: ``compute_ms``
        and ``collective_ms`` by kind."""
        per = 1e3 / max(self.counted, 1)
        names = [f"{i} {name}" for i, name in enumerate(self.names)] + ["after the layers"]
        return [{"layer": name, "compute_ms": round(c * per, 4),
                 "collective_ms": {k: round(v * per, 4) for k, v in sorted(w.items())}}
                for name, c, w in zip(names, self.compute, self.waits)]


def activation_bytes(model) -> int:
    """Bytes of the arrays ``model``'s layers hold besides its parameters and gradients (the
    activations kept for the backward and the layers' work buffers), each buffer once."""
    import numpy as np
    from psgd.nn.model import _walk
    owned = [a for a in (model.params, getattr(model, "_grad", None)) if a is not None]
    seen: set[int] = set()

    def arrays(obj, depth: int):
        for value in vars(obj).values():
            if isinstance(value, np.ndarray):
                yield value
            elif isinstance(value, dict):
                yield from (v for v in value.values() if isinstance(v, np.ndarray))
            elif depth and hasattr(value, "_bufs"):   # a split layer's inner layer
                yield from arrays(value, depth - 1)

    total = 0
    for layer in _walk(model.layers):
        for a in arrays(layer, 2):
            base = a if a.base is None else a.base
            if id(base) in seen or any(np.may_share_memory(a, p) for p in owned):
                continue
            seen.add(id(base))
            total += getattr(base, "nbytes", a.nbytes)
    dlogits = getattr(model, "_dlogits", None)
    return total + (dlogits.nbytes if dlogits is not None else 0)
