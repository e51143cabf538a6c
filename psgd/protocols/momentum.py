"""``--momentum-correction`` resolved in one place: where a run's momentum lives.

``servers``: the optimizer's own (on the servers, or each all-reduce replica);
``workers``: each worker keeps a velocity and pushes it (:mod:`psgd.compress.momentum`);
``gain``: the servers step plain SGD at the momentum's gain (:mod:`psgd.compress.gain`).
"""
from __future__ import annotations

from dataclasses import dataclass

from psgd.compress import gain
from psgd.compress.momentum import MOMENTUM_OPTIMIZERS, SETTINGS
from psgd.errors import UsageError
from psgd.ps import compensation


@dataclass(frozen=True)
class MomentumPlan:
    """What the job builds from the mode: the servers' (or replicas') optimizer, its
    hyper-parameters and learning rates, the workers' velocity settings (None: none) and
    the momentum the gain stands for (0: none)."""

    mode: str
    optimizer: str
    opt_hparams: dict
    schedule: object
    worker_momentum: dict | None = None
    momentum_gain: float = 0.0


def mode(protocol, setting: str, *, optimizer: str, feedback: bool, gain_feedback: bool = False,
         staleness_comp: str | None = None) -> str:
    """``gain``, ``workers`` or ``servers`` for ``--momentum-correction setting``.

    ``auto`` takes the gain where ``gain_feedback`` (:func:`psgd.compress.gain.auto_feedback`)
    and the entry's ``momentum-gain`` ability allow, else the workers' velocities where error
    ``feedback`` runs and the entry's ``momentum_correction`` and the staleness
    compensation allow.

    Raises
    ------
    ValueError
        An unknown setting; ``on`` or ``gain`` without momentum; ``on`` with a
        ``--staleness-comp`` that rewrites the gradients (the servers would get velocities).
    """
    has_momentum = optimizer in MOMENTUM_OPTIMIZERS
    if setting == "gain" and not has_momentum:
        raise UsageError(f"--momentum-correction gain needs --optimizer momentum or nesterov, "
                         f"not {optimizer}")
    if protocol.can("momentum-gain") and has_momentum and (
            setting == "gain" or setting == "auto" and gain_feedback):
        return "gain"
    method = protocol.compensation(staleness_comp, optimizer, worker_momentum=True)
    composes = method in compensation.with_worker_momentum()
    if setting == "on" and not composes:
        raise UsageError(f"--momentum-correction on does not apply with --staleness-comp "
                         f"{method}, which rewrites each gradient before the momentum sums "
                         f"it (the servers would get velocities); use "
                         f"{' or '.join(compensation.with_worker_momentum())}")
    if setting not in SETTINGS:
        raise UsageError(f"--momentum-correction {setting!r} is not auto, on, off or gain")
    if setting == "on" and not has_momentum:
        raise UsageError(f"--momentum-correction on needs --optimizer momentum or nesterov, "
                         f"not {optimizer}")
    moves = setting == "on" or setting == "auto" and feedback
    return "workers" if protocol.can("momentum-correction") and composes and has_momentum and moves \
        else "servers"


def plan(protocol, setting: str, *, optimizer: str, momentum: float, weight_decay: float,
         opt_hparams: dict, schedule, feedback: bool, gain_feedback: bool,
         staleness_comp: str | None) -> MomentumPlan:
    """The :class:`MomentumPlan` of a run (``opt_hparams`` and ``schedule``: the optimizer's
    as the settings give them)."""
    where = mode(protocol, setting, optimizer=optimizer, feedback=feedback,
                 gain_feedback=gain_feedback, staleness_comp=staleness_comp)
    if where == "gain":
        optimizer, hparams, schedule = gain.server_step(momentum, weight_decay, schedule)
        return MomentumPlan(where, optimizer, hparams, schedule, momentum_gain=momentum)
    if where == "workers":   # the workers apply the momentum and the weight decay
        velocity = {**opt_hparams, "nesterov": optimizer == "nesterov"}
        return MomentumPlan(where, optimizer, {"momentum": 0.0, "weight_decay": 0.0}, schedule,
                            worker_momentum=velocity)
    return MomentumPlan(where, optimizer, opt_hparams, schedule)
