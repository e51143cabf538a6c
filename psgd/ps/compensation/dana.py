"""DANA (Hakimi et al. 2019): bsp's momentum kept per worker, and pulls answered with a look-ahead.

Each worker i has its own velocity on the server, ``v_i = gamma v_i + g``,
and its push steps ``lr / W * v_i``: over a round in which every worker
pushes once the velocities sum to bsp's momentum on the mean gradient, so
the step per sample is bsp's.  A pull is answered where the parameters are
expected to be when the push lands (DANA-Zero): moved by the momentum of the
other workers' pushes in between and of the puller's own,
``w - lr / W * gamma * (d_i / (W - 1) * sum_{j != i} v_j + v_i)``, d_i worker
i's running mean delay in updates (W - 1 when every other worker pushes once
in between, as under ssp; more for a straggler).  The own term is Nesterov's
correction, so momentum and nesterov run the same update here; without it
the velocities drift apart in opposite directions (each worker's gradient
brakes the others' momentum into its own velocity), which cancels in their
sum only while every worker keeps pushing.  A push staler than the mean
delay d of all pushes, delay > d, enters its velocity scaled by
``(1 + d) / (1 + delay)`` (AdaDelay, as amom does).
"""
from __future__ import annotations

import numpy as np

from psgd.kernels.staleness import dana_push, dana_reply
from psgd.ps.compensation.amom import RunningMean
from psgd.ps.compensation.lookahead import LookAhead


class Dana(LookAhead):
    """Per-worker velocities and look-ahead replies.

    Memory: W velocities, their sum, and one reply buffer per worker (two
    with overlap): (2 W + 1) shard lengths, (3 W + 1) with overlap.
    The server's optimizer is left stepping plain SGD on ``v_i``; checkpoints
    keep the velocities (a resumed run re-measures the delays).
    """

    name = "dana"
    describes = "look-ahead, in other workers' pushes"

    def __init__(self, config, optimizer, n, n_workers=1):
        super().__init__(config, optimizer, n, n_workers)
        self.gamma = float(optimizer.momentum)
        self.weight_decay = optimizer.weight_decay
        optimizer.momentum, optimizer.nesterov, optimizer.weight_decay = 0.0, False, 0.0
        self.velocity = np.zeros((n_workers, n), np.float32)
        self.total = np.zeros(n, np.float32)     # of the workers still pushing
        self.active = np.ones(n_workers, bool)
        self.delay = RunningMean()

    def buffers(self):
        return list(self.velocity) + [self.total] + super().buffers()

    def adjust(self, grad, lr, staleness, delay, now, read, worker=0):
        mean = self.delay.add(delay)
        self.own[worker].add(delay)
        scale = min(1.0, (1.0 + mean) / (1.0 + delay))
        velocity = self.velocity[worker]
        dana_push(grad, now, velocity, self.total, self.gamma, self.weight_decay, scale)
        return velocity, lr / self.counted

    def count_delay(self, delay, worker):
        self.delay.add(delay)
        self.own[worker].add(delay)

    def reply(self, worker, clock, live, lr):
        if not self.looks_ahead():
            return live
        ahead = self.own[worker].value / (self.counted - 1)
        self.factor.add(ahead)
        out = self.reply_buffer(worker, clock)
        step = -lr / self.counted * self.gamma
        dana_reply(live, self.total, self.velocity[worker], out, step * ahead, step)
        return out

    def state(self):
        return {f"dana_velocity_{i}": v for i, v in enumerate(self.velocity)}

    def load_state(self, state):
        """Each worker's velocity back (a worker beyond the checkpoint's W starts at zero)."""
        super().load_state(state)
        self._resum()

    def worker_done(self, worker):
        """A finished worker's velocity will never step: no look-ahead counts it any more
        (it is kept for checkpoints, from which a resumed run steps it again)."""
        self.active[worker] = False
        self._resum()

    def vacate(self):
        """``--elastic``: no velocity counts until its worker joins; those a resumed
        checkpoint carried wait in their slots for the joiners (:meth:`carried`)."""
        super().vacate()
        self.active[:] = False
        self._resum()

    def joined(self, worker):
        """Its velocity counts from now on: zero, or the one its slot carried from a
        checkpoint."""
        super().joined(worker)
        self.active[worker] = True
        self._resum()

    def lost(self, worker):
        """A lost worker's velocity will never step: it leaves the look-ahead and N, and is
        zeroed, so no checkpoint carries it to a later joiner (docs/design/elastic.md)."""
        self.velocity[worker] = 0.0
        super().lost(worker)

    def carried(self):
        """The slots whose velocity is not zero: those live at the checkpoint (and pushed)."""
        return [w for w in range(self.n_workers) if self.velocity[w].any()]

    def _resum(self):
        np.sum(self.velocity[self.active], axis=0, out=self.total)   # afresh: no rounding


    def summary(self):
        return {**super().summary(), "mean delay": self.delay.value}
