"""The ssp (and asp = ssp with s = inf) update rule: apply each push as it arrives.

The bound itself is the server's pull rule (:mod:`psgd.ps.server`): a pull for
clock c waits until the shard's version v >= c - s, so no push is staler than s.
Each push passes through the run's staleness compensation (:mod:`psgd.ps.compensation`).
"""
from __future__ import annotations

import numpy as np

from psgd.config import ProtocolConfig
from psgd.kernels.finite import finite
from psgd.ps import compensation
from psgd.ps.order import PUSHED, REPLIED
from psgd.ps.update import UpdateRuleBase
from psgd.ps.versions import ShardVersions


class SspUpdate(UpdateRuleBase):
    """One optimizer step per push, with the learning rate of the push's clock.

    Memory: one float32 receive buffer of the shard's length, the
    compensation's own buffers, and, for a method that reads the parameters
    a push was computed on, a copy of each worker's last reply (two with
    overlap, whose next reply may come before the push).
    """

    def __init__(self, config: ProtocolConfig, optimizer, versions: ShardVersions,
                 n_workers: int = 1) -> None:
        self.config = config
        self.optimizer = optimizer
        self.versions = versions
        n = versions.live.shape[0]
        self.comp = compensation.make(config.compensation.staleness_comp, config, optimizer, n, n_workers)
        self.slots = 2 if config.overlap else 1
        self.read_count = np.zeros((n_workers, self.slots), np.int64)
        self.reads = (np.zeros((n_workers, self.slots, n), np.float32)
                      if self.comp.reads_params else None)
        self.incoming = np.empty_like(versions.live)
        self.n_updates = 0

    def buffers(self) -> list:
        """The shard-length buffers this rule holds."""
        reads = [] if self.reads is None else list(self.reads.reshape(-1, self.reads.shape[2]))
        return [self.incoming] + self.comp.buffers() + reads

    def receive_buffer(self) -> np.ndarray:
        """Where the next push lands."""
        return self.incoming

    def renew_receive_buffer(self) -> None:
        """A receive into :meth:`receive_buffer` was abandoned (its sender was lost
        mid-transfer, and MPI may still write it): the next push lands in a new buffer."""
        self.incoming = np.empty_like(self.incoming)

    def replied(self, worker: int, clock: int, live: np.ndarray) -> np.ndarray:
        """The server answers worker ``worker``'s pull for ``clock`` now: what to send
        (``live``, or the compensation's own answer, such as dana's look-ahead)."""
        slot = clock % self.slots
        self.read_count[worker, slot] = self.n_updates
        if self.reads is not None:
            np.copyto(self.reads[worker, slot], live)
        return self.comp.reply(worker, clock, live, self.config.lr_schedule(clock))

    def worker_done(self, worker: int) -> None:
        """Worker ``worker`` will push no more."""
        self.comp.worker_done(worker)

    def vacate(self) -> None:
        """``--elastic``: no worker is counted until it joins."""
        self.comp.vacate()

    def worker_joined(self, worker: int) -> None:
        """``--elastic``: a worker took slot ``worker``."""
        self.comp.joined(worker)

    def worker_lost(self, worker: int) -> None:
        """``--elastic``: slot ``worker``'s worker was lost: it will push no more, and the
        compensation's replies to it are not waited on."""
        self.comp.lost(worker)

    def carried(self) -> list:
        """The slots whose compensation state a resumed checkpoint carried."""
        return self.comp.carried()

    def state(self) -> dict:
        """The compensation's per-element state by name, for checkpoints."""
        return self.comp.state()

    def load_state(self, state: dict) -> None:
        """The compensation's state from a resumed checkpoint's (cut to this shard)."""
        self.comp.load_state(state)

    def settle(self) -> None:
        """Before a snapshot: the compensation's derived state rebuilt from what the snapshot
        keeps (dana's sum of the velocities, re-summed), as a run resumed from it rebuilds it."""
        self.comp.load_state(self.comp.state())

    def recount(self, events: np.ndarray) -> None:
        """Count the delays of a record's pushes (``psgd.ps.order`` events, before a resumed
        step) into the compensation's running means, as the recorded run counted them."""
        updates, read = 0, np.zeros_like(self.read_count)
        for kind, worker, clock in np.asarray(events).tolist():
            if kind == REPLIED:
                read[worker, clock % self.slots] = updates
            elif kind == PUSHED:
                self.comp.count_delay(updates - int(read[worker, clock % self.slots]), worker)
                updates += 1

    def reply_sent(self, worker: int, clock: int, request) -> None:
        """The send of a reply that is not ``live`` started (the compensation keeps its array)."""
        self.comp.reply_sent(worker, clock, request)

    def requests(self) -> list:
        """Sends of the compensation's replies not yet seen complete."""
        return self.comp.requests()

    def push(self, grad: np.ndarray, clock: int, staleness: int, source: int,
             borrowed: bool = False, worker: int = 0) -> bool:
        """Apply one worker's gradient (float32, shard length) now; False if it was not finite.

        ``grad`` is only read (``borrowed``: a worker's push-window segment).
        ``worker`` (0..W-1) finds the reply this push was computed on.
        """
        slot = clock % self.slots
        if self.config.skip_nonfinite and self.comp.name != "none" and not finite(grad):
            return False   # before the method's running statistics see it
        read = None if self.reads is None else self.reads[worker, slot]
        grad, lr = self.comp.adjust(grad, self.config.lr_schedule(clock), staleness,
                                    int(self.n_updates - self.read_count[worker, slot]),
                                    self.versions.live, read, worker)
        if not self.versions.step(self.optimizer, grad, lr,
                                  skip_nonfinite=self.config.skip_nonfinite):
            return False
        self.n_updates += 1
        return True

    def worker_momentum(self) -> float:
        """The momentum of the workers' velocities now (``--momentum-correction``; else 0)."""
        return self.comp.worker_momentum()

    def compensation(self) -> dict:
        """What the staleness compensation did, for the run's summary."""
        return self.comp.summary()
