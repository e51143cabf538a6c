"""The ssp (and asp = ssp with s = inf) update rule: apply each push as it arrives.

The bound itself is the server's pull rule (:mod:`psgd.ps.server`): a pull for
clock c waits until the shard's version v >= c - s, so no push is staler than s.
"""
from __future__ import annotations

import numpy as np

from psgd.config import ProtocolConfig
from psgd.ps.versions import ShardVersions


class SspUpdate:
    """One optimizer step per push, with the learning rate of the push's clock.

    Memory: one float32 receive buffer of the shard's length.
    """

    def __init__(self, config: ProtocolConfig, optimizer, versions: ShardVersions) -> None:
        self.config = config
        self.optimizer = optimizer
        self.versions = versions
        self.inverse = config.staleness_lr == "inverse"
        self.incoming = np.empty_like(versions.live)
        self.n_updates = 0

    def buffers(self) -> list:
        """The shard-length buffers this rule holds."""
        return [self.incoming]

    def receive_buffer(self) -> np.ndarray:
        """Where the next push lands."""
        return self.incoming

    def push(self, grad: np.ndarray, clock: int, staleness: int, source: int,
             borrowed: bool = False) -> bool:
        """Apply one worker's gradient (float32, shard length) now; False if it was not finite.

        ``source`` (the worker's rank) is not needed: the check shares the
        step's pass, so the server names the sender from the return value.
        ``borrowed`` (a lent push, read in place from the push window) changes
        nothing: the gradient is only read, and only while this runs.
        """
        lr = self.config.lr_schedule(clock)
        if self.inverse:
            lr = lr / (1.0 + staleness)
        if not self.versions.step(self.optimizer, grad, lr,
                                  skip_nonfinite=self.config.skip_nonfinite):
            return False
        self.n_updates += 1
        return True

    def idle(self) -> None:
        """Nothing is left unchecked between pushes."""

    def advance(self, old_version: int, new_version: int) -> bool:
        """Nothing to do when the version advances."""
        return True
