"""Bulk-synchronous parallel: the server averages all workers' gradients of clock c into one optimizer step.

The server sums the gradients of the W workers for clock c in one accumulation
buffer, and when the last of them arrives (the shard version advances from c
to c+1) applies one step with the mean (the sum times 1 / the number summed,
so a step equals SGD on the union of equal batches) and ``lr_schedule(c)``.
Pulls for clock c+1 are answered only after that step (the pull rule of
:mod:`psgd.server` with bound s = 0), so every push has staleness 0.  A
worker that has finished no longer counts towards "all workers".  A worker
gains nothing by asking for clock c+1 before it pushes clock c: the pull waits
for its own push too, so bsp does not overlap pulls with computation.
"""
from __future__ import annotations

import numpy as np

from psgd.kernels.step_into import add_into, finite
from psgd.protocols.config import ProtocolConfig
from psgd.shard_versions import ShardVersions

STALENESS_BOUND = 0


class BspUpdate:
    """Accumulate the pushes of one clock; step when the version advances.

    Memory: two float32 buffers of the shard's length, the sum and the receive
    buffer; a push is added into the receive buffer (``incoming = sum +
    incoming``, checked for NaN/Inf in the same pass) and the two swap, so a
    non-finite push leaves the sum intact.
    """

    def __init__(self, config: ProtocolConfig, optimizer, versions: ShardVersions) -> None:
        self.config = config
        self.optimizer = optimizer
        self.versions = versions
        self.accum = np.zeros_like(versions.live)
        self.incoming = np.empty_like(versions.live)
        self.count = 0
        self.n_updates = 0

    def buffers(self) -> list:
        """The shard-length buffers this rule holds."""
        return [self.accum, self.incoming]

    def receive_buffer(self) -> np.ndarray:
        """Where the next push lands."""
        return self.incoming

    def push(self, grad: np.ndarray, clock: int, staleness: int) -> bool:
        """Add one worker's gradient (float32, shard length) to the sum of ``clock``.

        Returns False, and leaves the sum as it was, when ``grad`` is not finite.
        """
        ok = finite(grad) if self.count == 0 else add_into(self.accum, grad)
        if not ok:
            return False
        self.accum, self.incoming = grad, self.accum
        self.count += 1
        return True

    def advance(self, old_version: int, new_version: int) -> bool:
        """All workers pushed clock ``old_version``: apply the mean as one step.

        Returns False (no step) when the sum of finite pushes overflowed float32.
        """
        if self.count == 0:
            return True
        count, self.count = self.count, 0
        if not self.versions.step(self.optimizer, self.accum,
                                  self.config.lr_schedule(old_version), scale=1.0 / count,
                                  skip_nonfinite=self.config.skip_nonfinite):
            return False
        self.n_updates += 1
        return True
