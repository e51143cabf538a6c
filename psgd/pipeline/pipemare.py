"""PipeMare (Yang et al., arXiv 1910.05124): an asynchronous pipeline with one weight copy.

Under 1F1B without a flush, stage s's forward of microbatch g sees its weights
``tau = K - s - 1`` updates old and its backward the newest.  PipeMare corrects for that
with (T1) a per-stage learning rate ``lr * tau ** -(1 - min(g / anneal, 1))``, which starts
at ``lr / tau`` and rises to ``lr`` over ``anneal`` steps, and (T2) discrepancy correction:
the backward runs on ``w - tau * delta``, ``delta`` an exponential moving average of the
stage's recent updates, an estimate of the weights the forward used.
"""
from __future__ import annotations

import numpy as np

from psgd.pipeline.schedules import versions_behind

DECAY = 0.1   # delta's weights fall to DECAY over tau updates: gamma = DECAY ** (1 / tau)


def rate(tau: int, g: int, anneal: int) -> float:
    """T1: the factor on stage's learning rate at step ``g`` (1 with no delay or anneal 0)."""
    if tau <= 0 or anneal <= 0:
        return 1.0
    return float(tau ** -(1.0 - min(g / anneal, 1.0)))


class Correction:
    """T2 on one stage: ``delta`` follows the stage's updates; :meth:`predict` the weights
    ``tau`` updates back."""

    def __init__(self, stages: int, stage: int, n: int, dtype) -> None:
        self.tau = versions_behind(stages, stage)
        self.gamma = DECAY ** (1.0 / self.tau) if self.tau else 0.0
        self.delta = np.zeros(n, dtype)

    def observe(self, before: np.ndarray, after: np.ndarray) -> None:
        """Fold the update ``after - before`` into ``delta`` (``before`` is overwritten)."""
        update = np.subtract(after, before, out=before)
        update *= 1.0 - self.gamma
        self.delta *= self.gamma
        self.delta += update

    def predict(self, weights: np.ndarray) -> np.ndarray | None:
        """The forward's weights as estimated from ``weights`` (None when there is no delay)."""
        if not self.tau:
            return None
        estimate = np.multiply(self.delta, self.tau)
        return np.subtract(weights, estimate, out=estimate)


def default_anneal(total_microbatches: int) -> int:
    """The rescheduling's length when ``--pipemare-anneal`` is not given: a quarter of the run."""
    return max(1, total_microbatches // 4)
