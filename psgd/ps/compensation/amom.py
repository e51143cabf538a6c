"""Asynchrony-aware momentum: the server's momentum lowered by the momentum asynchrony adds.

Asynchrony with a mean delay of tau updates acts like momentum tau / (1 + tau)
(Mitliagkas et al. 2016, "Asynchrony begets momentum").  Momentum mu's gain
on a steady gradient is 1 / (1 - mu); two momenta in series multiply their
gains, so the explicit momentum that keeps the total at the user's mu is
``mu_e = 1 - (1 - mu) * (1 + tau)``.  Past tau = mu / (1 - mu) it would be
negative: then mu_e = 0 and the learning rate is scaled by
``1 / ((1 - mu) * (1 + tau))`` instead, which keeps the gain.  A push staler
than the mean, delay d > tau, is scaled by ``(1 + tau) / (1 + d)`` as well
(AdaDelay's step that follows the push's own delay, Sra et al. 2016), so a
straggler's pushes do not land at full step on momentum set for the fast
workers.  The learning rate also ramps up linearly over the first 50 W
updates (``--amom-warmup``), while the delay's running mean is still young
and the gradients are at their largest.  Under ``--elastic`` W is the live workers.
With ``--momentum-correction`` the momentum is the workers'
(``config.worker_momentum``): the server keeps only the learning-rate
factors, and each pull reply tells the worker the momentum in force.  A
worker's velocity steps once per W server updates, so it takes mu_e ** W and
the step a factor that keeps the gain (:func:`velocity_momentum`).
"""
from __future__ import annotations

from psgd.ps.compensation.base import Compensation, Summary

DELAY_DECAY = 0.99   # the running mean of the delay forgets over about 100 updates
WARMUP_PER_WORKER = 50   # the learning rate ramps up over the first 50 W updates


class AsyncAwareMomentum(Compensation):
    """Momentum (or Adam's beta1) set each update from the running mean delay."""

    name = "amom"
    describes = "momentum in force"

    def __init__(self, config, optimizer, n, n_workers=1):
        super().__init__(config, optimizer, n, n_workers)
        self.key = "beta1" if hasattr(optimizer, "beta1") else "momentum"
        self.remote = config.worker_momentum is not None   # the workers hold the momentum
        self.target = (float(config.worker_momentum["momentum"]) if self.remote else
                       float(getattr(optimizer, self.key, 0.0)))
        self.mu = self.target   # in force: explicit_momentum(target, 0) before any push
        self.delay = RunningMean()
        self.lr_factor = Summary()
        per_worker = config.compensation.amom_warmup
        self.per_worker = WARMUP_PER_WORKER if per_worker is None else per_worker
        self.updates = 0

    def adjust(self, grad, lr, staleness, delay, now, read, worker=0):
        mean = self.delay.add(delay)
        mu, scale = explicit_momentum(self.target, mean)
        workers = max(1, self.counted)   # W, or under --elastic the live workers
        if self.remote:
            mu, gain = velocity_momentum(mu, workers)
            scale *= gain
        self.updates += 1
        warmup = self.per_worker * workers
        ramp = min(1.0, self.updates / warmup) if warmup else 1.0
        scale *= ramp * min(1.0, (1.0 + mean) / (1.0 + delay))
        self.mu = mu
        if not self.remote and hasattr(self.optimizer, self.key):
            setattr(self.optimizer, self.key, mu)
        self.factor.add(mu)
        self.lr_factor.add(scale)
        return grad, lr * scale

    def worker_momentum(self):
        return self.mu if self.remote else 0.0

    def summary(self):
        return {**super().summary(), "learning-rate factor": self.lr_factor.as_dict(),
                "mean delay": self.delay.value}


class RunningMean:
    """An exponential running mean with Adam's bias correction, so the first values count fully."""

    def __init__(self, decay: float = DELAY_DECAY) -> None:
        self.decay, self.total, self.weight = decay, 0.0, 0.0

    def add(self, value: float) -> float:
        """Count ``value``; returns the mean so far."""
        self.total = self.decay * self.total + (1.0 - self.decay) * value
        self.weight = self.decay * self.weight + (1.0 - self.decay)
        return self.value

    @property
    def value(self) -> float:
        return self.total / self.weight if self.weight else 0.0


def explicit_momentum(target: float, mean_delay: float) -> tuple[float, float]:
    """``(mu_e, lr_scale)`` keeping the gain ``1 / (1 - target)`` at a mean delay of tau updates."""
    residual = (1.0 - target) * (1.0 + mean_delay)
    if residual <= 1.0:
        return 1.0 - residual, 1.0
    return 0.0, 1.0 / residual


def velocity_momentum(mu_e: float, n_workers: int) -> tuple[float, float]:
    """``(mu_w, lr_scale)``: a worker's velocity for the servers' momentum ``mu_e``.

    One worker's pushes are W server updates apart on average, so its velocity
    decays W times slower per update than the servers' would at the same
    momentum.  ``mu_w = mu_e ** W`` keeps the servers' decay per update, and
    ``lr_scale = (1 - mu_w) / (1 - mu_e)`` their gain: a gradient's steps then
    add up over each W updates to what the servers' momentum would take there.
    """
    if n_workers == 1:
        return mu_e, 1.0
    mu_w = mu_e ** n_workers
    return mu_w, (1.0 - mu_w) / (1.0 - mu_e)
