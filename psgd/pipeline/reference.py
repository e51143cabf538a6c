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


def reference_pipedream(model, optimizer, xs, ys, bounds, lr, vertical: bool = False) -> list[float]:
    """PipeDream with weight stashing on one process: microbatch g (``xs[g]``, ``ys[g]``)
    runs forward and backward on stage s's weights after ``max(0, g - (K - s - 1))`` of its
    updates (``vertical``: ``max(0, g - (K - 1))`` on every stage), and then every stage
    steps once with its part of that gradient at ``lr(g)``.
    Returns each microbatch's loss; ``model.params`` ends as the pipeline's do."""
    from psgd.pipeline.schedules import versions_behind
    k = len(bounds)
    ranges = [[(lo, hi) for i, _, lo, hi in model.param_ranges if a <= i < b] for a, b in bounds]
    spans = [(min(r[0] for r in rs), max(r[1] for r in rs)) if rs else (0, 0) for rs in ranges]
    history, losses = [model.params.copy()], []
    for g in range(len(xs)):
        for s, (lo, hi) in enumerate(spans):
            behind = k - 1 if vertical else versions_behind(k, s)
            model.params[lo:hi] = history[max(0, g - behind)][lo:hi]
        if model.stochastic:
            model.reseed(0, g)
        loss, _ = model.loss_and_grad(xs[g], ys[g])
        losses.append(loss)
        latest = history[-1].copy()
        optimizer.step(latest, model.grad, lr(g))
        history.append(latest)
    model.params[:] = history[-1]
    return losses
