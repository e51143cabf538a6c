"""The base of a parameter server's update rule: the defaults of a rule without stale pushes.

A rule (:class:`psgd.ps.bsp.BspUpdate`, :class:`psgd.ps.ssp.SspUpdate`) overrides what it
does; the interface it meets is :class:`psgd.protocols.interfaces.UpdateRule`.
"""
from __future__ import annotations

import numpy as np

from psgd.config import ProtocolConfig


class UpdateRuleBase:
    """Defaults: every reply is ``live``, nothing kept per worker, nothing left to check."""

    config: ProtocolConfig

    def replied(self, worker: int, clock: int, live: np.ndarray) -> np.ndarray:
        """What answers worker ``worker``'s pull for ``clock``: ``live`` as it is."""
        return live

    def reply_sent(self, worker: int, clock: int, request) -> None:
        """The send of a reply that is not ``live`` started (never, by default)."""

    def requests(self) -> list:
        """Sends of the rule's own replies not yet seen complete (none)."""
        return []

    def worker_done(self, worker: int) -> None:
        """Worker ``worker`` will push no more."""

    def vacate(self) -> None:
        """``--elastic``: no worker is counted until it joins (nothing here)."""

    def worker_joined(self, worker: int) -> None:
        """``--elastic``: a worker took slot ``worker`` (nothing here)."""

    def worker_lost(self, worker: int) -> None:
        """``--elastic``: slot ``worker``'s worker was lost (here: as if it were done)."""
        self.worker_done(worker)

    def carried(self) -> list:
        """The slots a resumed checkpoint carried per-worker state for (none)."""
        return []

    def state(self) -> dict:
        """Per-element state beside the optimizer's, for checkpoints (none)."""
        return {}

    def load_state(self, state: dict) -> None:
        """Take back :meth:`state` from a resumed checkpoint."""

    def settle(self) -> None:
        """Before a held snapshot (``config.hold_at_snapshots``): derived state rebuilt as a
        run resumed from the snapshot rebuilds it (nothing here)."""

    def recount(self, events) -> None:
        """A resumed replay: count the recorded events before its step into the running
        statistics (none here)."""

    def compensation(self) -> dict | None:
        """What the staleness compensation did, for the run's summary (None: none ran)."""
        return None

    def worker_momentum(self) -> float:
        """The momentum of the workers' velocities (``--momentum-correction``; else 0)."""
        return float((self.config.worker_momentum or {}).get("momentum", 0.0))

    def idle(self) -> None:
        """Work to do while the server waits anyway (none)."""

    def advance(self, old_version: int, new_version: int) -> bool:
        """The shard's version advanced; False if the step was not finite."""
        return True
