"""What every protocol is told: the settings of one run that servers and workers share."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from psgd.env import env_int

PS_PROTOCOLS = ("bsp", "ssp", "asp", "hogwild")
PROTOCOLS = PS_PROTOCOLS + ("allreduce",)


@dataclass
class ProtocolConfig:
    """Settings of one run, identical on every rank.

    Attributes
    ----------
    protocol : str
        One of :data:`PROTOCOLS`.
    n_params : int
        Length of the flat parameter vector.
    optimizer : str
        Optimizer name for :func:`psgd.nn.optim.make_optimizer`.
    opt_hparams : dict
        Keyword arguments for :func:`psgd.nn.optim.make_optimizer` (momentum, weight_decay, ...).
    lr_schedule : callable
        ``lr_schedule(clock) -> float``: the learning rate of an update computed at ``clock``.
    staleness : float
        SSP bound s (0 for bsp, ``math.inf`` for asp).
    staleness_lr : str
        ``"none"`` or ``"inverse"`` (divide each update's step by 1 + its staleness).
    snapshot_every : int
        Servers snapshot their shard (params + optimizer state) every this many
        clocks for checkpoints; 0 = never.
    skip_nonfinite : bool
        Skip (and count) pushes holding NaN/Inf instead of failing the job.
    push_window : bool
        bsp/ssp/asp: a worker's pushes to the servers of its own node go
        through shared memory (:mod:`psgd.ps.push_window`); False keeps them to
        messages.  Default: ``PSGD_PS_PUSH_WINDOW`` (unset = on).
    """

    protocol: str
    n_params: int
    optimizer: str = "sgd"
    opt_hparams: dict = field(default_factory=dict)
    lr_schedule: Callable[[int], float] = lambda clock: 0.01
    staleness: float = 0.0
    staleness_lr: str = "none"
    snapshot_every: int = 0
    skip_nonfinite: bool = False
    push_window: bool = field(default_factory=lambda: env_int("PSGD_PS_PUSH_WINDOW", 1) != 0)

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"unknown protocol {self.protocol!r}; choose one of {', '.join(PROTOCOLS)}")
        if self.protocol == "asp":
            self.staleness = math.inf
        elif self.protocol == "bsp":
            self.staleness = 0.0
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {self.staleness}")
        if self.staleness_lr not in ("none", "inverse"):
            raise ValueError(f"unknown staleness-lr {self.staleness_lr!r}; choose none or inverse")
