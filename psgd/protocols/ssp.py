"""Stale synchronous parallel (and asp = ssp with s = inf): apply each push as it arrives, bound the staleness of reads.

Each push for clock c is applied at once with ``lr_schedule(c)`` (divided by
1 + staleness when ``staleness_lr == "inverse"``).  A pull for clock c is
answered only when the shard version v >= c - s (the pull rule in
:mod:`psgd.server`), so a push's staleness c - v never exceeds s; s = 0 is a
barrier per clock.  ``asp`` is this module with s = inf: pulls never wait
(Downpour SGD).
"""
from __future__ import annotations

import numpy as np

from psgd.protocols.config import ProtocolConfig


class SspUpdate:
    """One optimizer step per push, with the learning rate of the push's clock."""

    def __init__(self, config: ProtocolConfig, optimizer, params: np.ndarray) -> None:
        self.config = config
        self.optimizer = optimizer
        self.params = params
        self.inverse = config.staleness_lr == "inverse"
        self.n_updates = 0

    def receive_buffer(self, scratch: np.ndarray) -> np.ndarray:
        """Pushes land in the server's scratch buffer."""
        return scratch

    def push(self, grad: np.ndarray, clock: int, staleness: int) -> None:
        """Apply one worker's gradient (float32, shard length) now."""
        lr = self.config.lr_schedule(clock)
        if self.inverse:
            lr = lr / (1.0 + staleness)
        self.optimizer.step(self.params, grad, lr)
        self.n_updates += 1

    def advance(self, old_version: int, new_version: int) -> None:
        """Nothing to do when the version advances."""
