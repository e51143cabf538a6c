"""DANA's look-ahead for Adam: pulls answered where Adam's next pushes are expected to carry the parameters.

The server steps Adam on every push as it comes (``none``).  A worker's
gradient lands after d_i other pushes, d_i its running mean delay in updates;
each of them steps ``lr * m_hat / (sqrt(v_hat) + eps)``, and the predictable
part of the first moment k pushes on is ``beta1^k m``.  So a pull is answered
with ``w - lr * beta1 (1 - beta1^d_i) / (1 - beta1) * m_hat / (sqrt(v_hat) + eps)``
and the gradient is taken about where it will land.  Adam's decoupled weight
decay is not looked ahead by.
"""
from __future__ import annotations

import numpy as np

from psgd.kernels.staleness import adam_reply
from psgd.mpi import wait as _wait
from psgd.ps.compensation.amom import RunningMean
from psgd.ps.compensation.base import Compensation


class DanaAdam(Compensation):
    """Adam's look-ahead replies.

    Memory: one reply buffer per worker (two with overlap): W shard lengths
    (2 W with overlap), beside Adam's own two.
    """

    name = "dana-adam"
    describes = "look-ahead, in Adam steps"

    def __init__(self, config, optimizer, n, n_workers=1):
        super().__init__(config, optimizer, n, n_workers)
        self.slots = 2 if config.overlap else 1
        self.out = np.zeros((n_workers, self.slots, n), np.float32)
        self.sends: dict[tuple[int, int], object] = {}
        self.own = [RunningMean() for _ in range(n_workers)]

    def buffers(self):
        return list(self.out.reshape(-1, self.n))

    def adjust(self, grad, lr, staleness, delay, now, read, worker=0):
        self.own[worker].add(delay)
        return grad, lr

    def reply(self, worker, clock, live, lr):
        opt = self.optimizer
        if opt.steps == 0:        # no moments yet: nothing to look ahead by
            return live
        slot = clock % self.slots
        sent = self.sends.pop((worker, slot), None)
        if sent is not None:
            _wait.wait(sent, f"worker {worker} to receive its previous look-ahead reply")
        b1 = opt.beta1
        steps = b1 * (1.0 - b1 ** self.own[worker].value) / (1.0 - b1)
        self.factor.add(steps)
        out = self.out[worker, slot]
        adam_reply(live, opt.m, opt.v, out, lr * steps / (1.0 - b1 ** opt.steps),
                   1.0 / np.sqrt(1.0 - opt.beta2 ** opt.steps), opt.eps)
        return out

    def reply_sent(self, worker, clock, request):
        self.sends[(worker, clock % self.slots)] = request

    def requests(self):
        return list(self.sends.values())
