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
from psgd.ps.compensation.lookahead import LookAhead


class DanaAdam(LookAhead):
    """Adam's look-ahead replies.

    Memory: one reply buffer per worker (two with overlap): W shard lengths
    (2 W with overlap), beside Adam's own two.
    """

    name = "dana-adam"
    describes = "look-ahead, in Adam steps"

    def adjust(self, grad, lr, staleness, delay, now, read, worker=0):
        self.own[worker].add(delay)
        return grad, lr

    def count_delay(self, delay, worker):
        self.own[worker].add(delay)

    def reply(self, worker, clock, live, lr):
        opt = self.optimizer
        if not self.looks_ahead() or opt.steps == 0:   # one worker, or no moments yet
            return live
        b1 = opt.beta1
        steps = b1 * (1.0 - b1 ** self.own[worker].value) / (1.0 - b1)
        self.factor.add(steps)
        out = self.reply_buffer(worker, clock)
        adam_reply(live, opt.m, opt.v, out, lr * steps / (1.0 - b1 ** opt.steps),
                   1.0 / np.sqrt(1.0 - opt.beta2 ** opt.steps), opt.eps)
        return out
