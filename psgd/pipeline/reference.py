"""The serial computation a pipeline step must equal: microbatch gradients summed in order, one step."""
from __future__ import annotations

import numpy as np


def reference_step(model, optimizer, x, y, microbatches: int, lr: float, key: tuple = (0, 0)) -> float:
    """One step of ``model`` on batch ``(x, y)`` split into ``microbatches``; the mean loss.

    The gradients of the microbatches' mean losses are added in microbatch order and
    ``optimizer`` (made for the whole vector) steps with ``scale = 1 / M``, as every
    pipeline stage does on its slice.
    """
    b = x.shape[0] // microbatches
    acc = np.zeros_like(model.grad)
    total = 0.0
    for m in range(microbatches):
        if model.stochastic:
            model.reseed(*key, m)
        loss, _ = model.loss_and_grad(x[m * b:(m + 1) * b], y[m * b:(m + 1) * b])
        np.add(acc, model.grad, out=acc)
        total += loss
    optimizer.step(model.params, acc, lr, scale=1.0 / microbatches)
    return total / microbatches
