"""Momentum as its gain alone, under bsp with error feedback: ``--momentum-correction gain``.

The workers push their gradients through error feedback and the servers step
plain SGD at ``lr / (1 - momentum)``, the gain of the momentum step on a
constant gradient, with no velocity.  A velocity pushed through error
feedback (``on``) steps the parts the residual holds back late, and the
momentum's memory then acts on them late again; the residual alone carries
them forward here.
"""
from __future__ import annotations


class ScaledSchedule:
    """``schedule(clock) * factor``: the learning rate of the servers' SGD step."""

    def __init__(self, schedule, factor: float) -> None:
        self.schedule, self.factor = schedule, float(factor)

    def __call__(self, clock: int) -> float:
        return self.schedule(clock) * self.factor


def auto_feedback(spec: str, feedback: bool, bucket: int) -> bool:
    """Whether ``auto`` would take the gain for ``--compress spec``: error feedback runs and
    the compressor says so (its ``momentum_gain``)."""
    from psgd.compress import make
    comp = make(spec, bucket)
    return feedback and comp is not None and comp.momentum_gain


def server_step(momentum: float, weight_decay: float, schedule) -> tuple[str, dict, ScaledSchedule]:
    """The servers' optimizer, its hyper-parameters and learning rates for momentum ``momentum``:
    sgd, with the weight decay, at the schedule times ``1 / (1 - momentum)``."""
    return ("sgd", {"weight_decay": weight_decay},
            ScaledSchedule(schedule, 1.0 / (1.0 - momentum)))
