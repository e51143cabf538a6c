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
    spans = _spans(model, bounds)
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


def reference_pipemare(model, make_optimizer, xs, ys, bounds, lr, anneal: int | None = None,
                       correct: bool = False, decay: float = 0.1) -> list[float]:
    """PipeMare on one process: microbatch g's forward runs stage s on its weights after
    ``max(0, g - tau_s)`` updates (``tau_s = K - s - 1``), its backward on the newest
    weights (``correct``: those less ``tau_s`` times the moving average of the stage's
    updates, ``gamma = decay ** (1 / tau_s)``), re-running the stage's forward on them;
    then each stage steps (``make_optimizer(n)`` per stage) at ``lr(g)`` times
    ``tau_s ** (min(g / anneal, 1) - 1)`` (``anneal`` None: times 1).
    Returns each microbatch's loss; ``model.params`` ends as the pipeline's do."""
    k = len(bounds)
    spans = _spans(model, bounds)
    taus = [k - s - 1 for s in range(k)]
    opts = [make_optimizer(hi - lo) for lo, hi in spans]
    deltas = [np.zeros(hi - lo, model.dtype) for lo, hi in spans]
    history, losses = [model.params.copy()], []
    for g in range(len(xs)):
        for (lo, hi), tau in zip(spans, taus):
            model.params[lo:hi] = history[max(0, g - tau)][lo:hi]
        inputs, loss = _forwards(model, bounds, xs[g], ys[g], (0, g))
        losses.append(loss)
        current = history[-1]
        grads, dy = [], model._dlogits
        for s in range(k - 1, -1, -1):
            lo, hi = spans[s]
            model.params[lo:hi] = current[lo:hi] - taus[s] * deltas[s] if correct and taus[s] \
                else current[lo:hi]
            grad, dy = _backward(model, bounds[s], spans[s], inputs[s], dy, s == k - 1, (0, g))
            grads.insert(0, grad)
        latest = current.copy()
        for s, (lo, hi) in enumerate(spans):
            factor = 1.0 if anneal is None or taus[s] == 0 else \
                float(taus[s] ** (min(g / anneal, 1.0) - 1.0))
            opts[s].step(latest[lo:hi], grads[s], lr(g) * factor)
            if correct and taus[s]:
                gamma = decay ** (1.0 / taus[s])
                deltas[s] = gamma * deltas[s] + (1.0 - gamma) * (latest[lo:hi] - current[lo:hi])
        history.append(latest)
    model.params[:] = history[-1]
    return losses


def _spans(model, bounds) -> list[tuple[int, int]]:
    ranges = [[(lo, hi) for i, _, lo, hi in model.param_ranges if a <= i < b] for a, b in bounds]
    return [(min(r[0] for r in rs), max(r[1] for r in rs)) if rs else (0, 0) for rs in ranges]


def _forwards(model, bounds, x, y, key) -> tuple[list, float]:
    """Every stage's forward in order: each stage's input (copied) and the loss."""
    inputs = []
    if model.stochastic:
        model.reseed(*key)
    for a, b in bounds:
        inputs.append(x.copy())
        for layer in model.layers[a:b]:
            layer.set_mode("train")
            x = layer.forward(x)
    return inputs, model._loss(x, y)[0]


def _backward(model, bound, span, x, dy, last: bool, key) -> tuple[np.ndarray, np.ndarray]:
    """One stage's backward from ``dy`` on the current weights (its forward run again first,
    but on the last stage, whose forward ran on them); its parameter gradient and ``dx``."""
    a, b = bound
    if not last:
        if model.stochastic:
            model.reseed(*key)
        for layer in model.layers[a:b]:
            x = layer.forward(x)
    for i in range(b - 1, a - 1, -1):
        dy = model.layers[i].backward(dy, need_dx=i > model._first_param_layer)
    return model.grad[span[0]:span[1]].copy(), dy
