"""Bulk-synchronous parallel: the server averages all workers' gradients of clock c into one optimizer step.

The server sums the gradients of the W workers for clock c in one accumulation
buffer, and when the last of them arrives (the shard version advances from c
to c+1) divides by the number summed (the mean, so a step equals SGD on the
union of equal batches) and applies one step with ``lr_schedule(c)``.  Pulls
for clock c+1 are answered only after that step (the pull rule of
:mod:`psgd.server` with bound s = 0), so every push has staleness 0.  A
worker that has finished no longer counts towards "all workers".
"""
from __future__ import annotations

import numpy as np

from psgd.protocols.config import ProtocolConfig

STALENESS_BOUND = 0


class BspUpdate:
    """Accumulate the pushes of one clock; step when the version advances.

    Memory: one float32 accumulation buffer of the shard's length.
    """

    def __init__(self, config: ProtocolConfig, optimizer, params: np.ndarray) -> None:
        self.config = config
        self.optimizer = optimizer
        self.params = params
        self.accum = np.zeros_like(params)
        self.count = 0
        self.n_updates = 0

    def receive_buffer(self, scratch: np.ndarray) -> np.ndarray:
        """Where the next push lands: straight into the sum when it is the first of the clock."""
        return self.accum if self.count == 0 else scratch

    def push(self, grad: np.ndarray, clock: int, staleness: int) -> None:
        """Add one worker's gradient (float32, shard length) to the sum of ``clock``."""
        if grad is not self.accum:
            self.accum += grad
        self.count += 1

    def advance(self, old_version: int, new_version: int) -> None:
        """All workers pushed clock ``old_version``: apply the mean as one step."""
        if self.count == 0:
            return
        if self.count > 1:
            self.accum *= np.float32(1.0 / self.count)
        self.optimizer.step(self.params, self.accum, self.config.lr_schedule(old_version))
        self.count = 0
        self.n_updates += 1
