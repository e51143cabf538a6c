"""Gap-Aware (Barkai et al., ICLR 2020): each element's step shrunk by how far it moved since the read."""
from __future__ import annotations

import numpy as np

from psgd.kernels.staleness import gap_grad
from psgd.ps.compensation.base import Compensation

MEANSQ_DECAY = 0.99


class GapAware(Compensation):
    """``g / (1 + |w_now - w_read| / C)``, C one typical step of an element.

    C = ``lr * sqrt(meansquare(g)) / (1 - momentum)``: the steady-state step of
    (momentum) SGD on gradients of that scale; Adam's step is about ``lr``.
    Memory as :class:`psgd.ps.compensation.dcasgd.DcAsgd`.
    """

    name = "gap"
    reads_params = True
    describes = "mean factor"

    def __init__(self, config, optimizer, n, n_workers=1):
        super().__init__(config, optimizer, n, n_workers)
        self.meansq = np.zeros(n, np.float32)
        self.out = np.empty(n, np.float32)

    def state(self):
        return {"gap_meansq": self.meansq}

    def buffers(self):
        return [self.meansq, self.out]

    def adjust(self, grad, lr, staleness, delay, now, read, worker=0):
        momentum = getattr(self.optimizer, "momentum", 0.0)
        scale = lr / (1.0 - momentum)
        if self.optimizer.name == "adam":   # a step of about lr whatever the gradient's scale
            scale = lr / max(float(np.sqrt(self.meansq.mean())), 1e-12)
        self.factor.add(gap_grad(grad, now, read, self.meansq, self.out, scale, MEANSQ_DECAY))
        return self.out, lr
