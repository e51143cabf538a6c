"""DC-ASGD-a (Zheng et al., ICML 2017): a first-order correction of the stale gradient."""
from __future__ import annotations

import numpy as np

from psgd.kernels.staleness import dcasgd_grad
from psgd.ps.compensation import DEFAULT_LAMBDA
from psgd.ps.compensation.base import Compensation

MEANSQ_DECAY = 0.95   # the paper's m for MeanSquare


class DcAsgd(Compensation):
    """``g + lambda_t * g*g * (w_now - w_read)`` with ``lambda_t = lambda_0 / sqrt(meansquare(g))``.

    Memory: the mean square and the corrected gradient (two shard lengths),
    plus the server's copy of each worker's read (W shard lengths).
    """

    name = "dcasgd"
    reads_params = True
    describes = "correction / gradient"

    def __init__(self, config, optimizer, n, n_workers=1):
        super().__init__(config, optimizer, n, n_workers)
        self.lam = DEFAULT_LAMBDA if config.compensation.comp_lambda is None else config.compensation.comp_lambda
        self.meansq = np.zeros(n, np.float32)
        self.out = np.empty(n, np.float32)

    def state(self):
        return {"dcasgd_meansq": self.meansq}

    def buffers(self):
        return [self.meansq, self.out]

    def adjust(self, grad, lr, staleness, delay, now, read, worker=0):
        self.factor.add(dcasgd_grad(grad, now, read, self.meansq, self.out, self.lam,
                                    MEANSQ_DECAY))
        return self.out, lr
