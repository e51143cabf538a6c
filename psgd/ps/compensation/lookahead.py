"""What the methods that answer pulls with a look-ahead share: a reply buffer per worker and slot."""
from __future__ import annotations

import numpy as np

from psgd.mpi import wait as _wait
from psgd.ps.compensation.amom import RunningMean
from psgd.ps.compensation.base import Compensation


class LookAhead(Compensation):
    """Replies written into the method's own buffers, and each worker's running mean delay.

    One buffer per worker (two with ``--overlap``, one per slot of clocks);
    none with one worker, whose pushes are never late (its replies are the
    parameters).  A buffer is written again only once its previous send is
    seen complete.

    Attributes
    ----------
    own : list of RunningMean
        Each worker's mean delay in updates, from its pushes (``adjust`` adds).
    counted : int
        N, the workers a look-ahead counts: W, or under ``--elastic`` the workers that joined
        and were not lost (a finished one still counts, as without ``--elastic``).
    """

    def __init__(self, config, optimizer, n, n_workers=1):
        super().__init__(config, optimizer, n, n_workers)
        self.slots = 2 if config.overlap else 1
        self.out = np.zeros((n_workers, self.slots, n), np.float32) if n_workers > 1 else None
        self.sends: dict[tuple[int, int], object] = {}
        self.own = [RunningMean() for _ in range(n_workers)]

    def looks_ahead(self) -> bool:
        """Whether a pull is answered with a look-ahead: not for one worker, whose pushes are
        never late."""
        return self.out is not None and self.counted > 1

    def joined(self, worker):
        super().joined(worker)
        self.own[worker] = RunningMean()

    def lost(self, worker):
        """Also forgets its replies' sends: a lost worker may never receive them, and the
        server would wait on them at the end."""
        for slot in range(self.slots):
            self.sends.pop((worker, slot), None)
        super().lost(worker)

    def buffers(self):
        return [] if self.out is None else list(self.out.reshape(-1, self.n))

    def reply_buffer(self, worker: int, clock: int) -> np.ndarray:
        """The buffer to answer ``worker``'s pull for ``clock`` in, its last send complete."""
        slot = clock % self.slots
        sent = self.sends.pop((worker, slot), None)
        if sent is not None:
            _wait.wait(sent, f"worker {worker} to receive its previous look-ahead reply")
        return self.out[worker, slot]

    def reply_sent(self, worker, clock, request):
        self.sends[(worker, clock % self.slots)] = request

    def requests(self):
        return list(self.sends.values())
