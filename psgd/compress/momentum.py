"""Momentum correction (Lin et al. 2018, Deep Gradient Compression): ``--momentum-correction``.

A worker keeps the momentum velocity of its own gradients and pushes it; the
servers (or the all-reduce's step) then take a plain SGD step on the mean of
the velocities, which is the momentum step on the mean gradient (the step is
linear).  Under ssp and asp each push is a step of its own, and the velocity
takes the momentum its server has in force (amom's, lowered by the delay),
sent with every pull reply.  What error feedback holds back then re-enters
one velocity instead of a server's momentum, which would repeat every late
part of it 1 / (1 - momentum) times.
"""
from __future__ import annotations

import numpy as np

SETTINGS = ("auto", "on", "off", "gain")   # gain: psgd.compress.gain
MOMENTUM_OPTIMIZERS = ("momentum", "nesterov")


class WorkerMomentum:
    """One worker's velocity; :meth:`apply` turns a gradient into what the worker sends.

    Parameters
    ----------
    n : int
    momentum : float
    nesterov : bool
    weight_decay : float
        Added to the gradient as ``wd * params`` before the velocity (the
        servers then step without weight decay).
    """

    def __init__(self, n: int, momentum: float, nesterov: bool, weight_decay: float) -> None:
        self.momentum, self.nesterov = float(momentum), bool(nesterov)
        self.weight_decay = float(weight_decay)
        self.velocity = np.zeros(n, np.float32)
        self.out = np.zeros(n, np.float32)

    def apply(self, grad: np.ndarray, params: np.ndarray, out: np.ndarray | None = None,
              parts: list | None = None) -> np.ndarray:
        """The direction to send for ``grad`` computed on ``params``, in ``out`` (default: own).

        ``parts``: ``(slice, momentum)`` pairs covering the vector, each part's
        velocity taking its own momentum (under ssp and asp, what each shard's
        server has in force); default: :attr:`momentum` over the whole vector.
        """
        from psgd.kernels.optim import momentum_direction   # numba: not on the ranks that never push
        out = self.out if out is None else out
        for part, mu in parts or [(slice(None), self.momentum)]:
            momentum_direction(grad[part], params[part], self.velocity[part], out[part], mu,
                               self.weight_decay, self.nesterov)
        return out
