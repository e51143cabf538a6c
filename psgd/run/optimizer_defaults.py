"""The optimizer, schedule and learning rate a run trains with when not told, by model kind."""
from __future__ import annotations

import math

from psgd.errors import UsageError
from psgd.nn.optim import DEFAULT_ALPHA, SCHEDULES
from psgd.nn.sparse import is_sparse_spec

# what a run that names no optimizer, learning rate or schedule trains with, by model kind
DENSE_DEFAULT = {"optimizer": "sgd", "lr_schedule": "constant", "lr": 0.1}
SPARSE_DEFAULT = {"optimizer": "adagrad", "lr_schedule": "constant", "lr": 0.2}


def default_text(d: dict) -> str:
    lr = f" --lr {d['lr']:g}" if d["lr"] is not None else ""
    return f"--optimizer {d['optimizer']} --lr-schedule {d['lr_schedule']}{lr}"


def fill_defaults(s) -> dict:
    """The optimizer, schedule and learning rate of settings ``s``, filled: a sparse model
    (linear, svm) given none of the three trains with :data:`SPARSE_DEFAULT`; otherwise what is
    missing is :data:`DENSE_DEFAULT`'s."""
    given = (s.optimizer, s.lr_schedule, s.lr) != (None, None, None)
    kind = DENSE_DEFAULT if given or not is_sparse_spec(s.model) else SPARSE_DEFAULT
    schedule = s.lr_schedule or kind["lr_schedule"]
    lr = kind["lr"] if s.lr is None and schedule != "optimal" else s.lr
    return {"optimizer": s.optimizer or kind["optimizer"], "lr_schedule": schedule, "lr": lr}


def check_optimizer(s, sparse_steps: bool = False) -> dict:
    """Check the schedule, --alpha and --momentum against the optimizer; return the two filled.
    ``sparse_steps``: the protocol steps a sparse model's touched rows only (hogwild)."""
    alpha, momentum = s.alpha, s.momentum
    if s.lr_schedule not in SCHEDULES:
        raise UsageError(f"--lr-schedule {s.lr_schedule!r} is not one of {', '.join(SCHEDULES)}")
    if s.lr_schedule == "optimal":
        if s.lr is not None:
            raise UsageError("--lr has no effect under --lr-schedule optimal (its rate is "
                             "1 / (alpha (t0 + t))): drop --lr, or set --alpha")
        if s.weight_decay:
            raise UsageError("--lr-schedule optimal takes its L2 penalty from --alpha: give "
                             "--alpha, not --weight-decay")
        alpha = DEFAULT_ALPHA if alpha is None else alpha
        if not (math.isfinite(alpha) and 0 < alpha < 1):
            raise UsageError(f"--alpha must be in (0, 1), got {alpha}")
    elif s.alpha is not None:
        raise UsageError(f"--alpha is the L2 penalty of --lr-schedule optimal; with "
                         f"--lr-schedule {s.lr_schedule} use --weight-decay")
    if s.optimizer == "adagrad":
        if s.momentum:
            raise UsageError(f"--optimizer adagrad takes no --momentum (got {s.momentum}): "
                             f"AdaGrad scales each coordinate's step and keeps no velocity")
        momentum = 0.0
        if s.weight_decay and sparse_steps and is_sparse_spec(s.model):
            raise UsageError(f"--optimizer adagrad with --weight-decay moves every row at every "
                             f"step, which --protocol {s.protocol}'s sparse steps cannot do "
                             f"lazily; drop --weight-decay")
    elif momentum is None:
        momentum = 0.9
    return {"alpha": alpha, "momentum": momentum}
