"""Running one batch's schedule on a stage: each op's receive, compute and send."""
from __future__ import annotations

import time

import numpy as np

from psgd.mpi import timeline
from psgd.pipeline.schedules import FORWARD


def run_batch(stage, links, ops, g0: int, key: tuple, xs=None, ys=None,
              after_backward=None, seed_from: int = 0) -> tuple[float, int, list]:
    """Run ``ops`` (:func:`psgd.pipeline.schedules.stage_ops`) for the microbatches ``g0 + m``.

    ``xs``: the microbatch inputs on the first stage; ``ys``: the labels on the last;
    ``key``: (replica, step), with the microbatch plus ``seed_from`` the dropout seed;
    ``after_backward(m)``: called after each backward (an asynchronous schedule's step).  Returns the
    summed loss and correct count over the microbatches (zeros but on the last stage)
    and the seconds spent computing forwards and backwards.
    """
    loss, correct, busy = 0.0, 0, [0.0, 0.0]
    for kind, m in ops:
        g = g0 + m
        if kind == FORWARD:
            x = xs[m] if stage.first else links.recv_activation(g)
            t = time.perf_counter()
            out = stage.forward(m, x, (*key, seed_from + m), None if ys is None else ys[m])
            busy[0] += _span("forward", t, g)
            if stage.last:
                loss, correct = loss + out[0], correct + out[1]
            else:
                links.send_activation(g, out)
        else:
            dy = None if stage.last else links.recv_gradient(g)
            t = time.perf_counter()
            dx = stage.backward(m, dy)
            busy[1] += _span("backward", t, g)
            links.release(g)
            if not stage.first:
                links.send_gradient(g, dx)
            if after_backward is not None:
                after_backward(m)
    return loss, correct, busy


def _span(kind: str, t0: float, g: int) -> float:
    """Seconds since ``t0``, recorded as a ``--timeline`` span of microbatch ``g`` when on."""
    t1 = time.perf_counter()
    if timeline.current is not None:
        timeline.current.span(kind, t0, t1, clock=g)
    return t1 - t0


def split(batch: np.ndarray, microbatches: int) -> list[np.ndarray]:
    """``batch`` (B, ...) as M contiguous views of B / M rows."""
    b = batch.shape[0] // microbatches
    return [batch[i * b:(i + 1) * b] for i in range(microbatches)]
