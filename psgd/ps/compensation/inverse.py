"""Inverse staleness: each step divided by 1 + the push's staleness in clocks."""
from __future__ import annotations

from psgd.ps.compensation.base import Compensation


class Inverse(Compensation):
    """``lr / (1 + staleness)`` (psgd's earlier ``--staleness-lr inverse``)."""

    name = "inverse"

    def adjust(self, grad, lr, staleness, delay, now, read, worker=0):
        factor = 1.0 / (1.0 + staleness)
        self.factor.add(factor)
        return grad, lr * factor
