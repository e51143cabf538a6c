"""What every protocol family is told: the settings of one run that servers and workers share.

:class:`ProtocolConfig` holds the protocol-level settings and, as one frozen object each, the
features the halves read (:class:`Compression`, :class:`Compensation`, :class:`Recording`,
:class:`HotRows`): the plan's own options (``psgd.run.features`` subclasses them with their
flags and checks), so a feature's flag reaches a half without passing through the job.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Compression:
    """``--compress`` and what rides on it (:mod:`psgd.compress`).

    ``error_feedback`` is the flag (auto, on or off); ``feedback`` whether it is in force for
    this compressor (the plan's options derive it from the flags); ``momentum_correction``
    the flag, which the job turns into :attr:`ProtocolConfig.worker_momentum` and
    :attr:`ProtocolConfig.momentum_gain`.
    """

    compress: str = "none"
    compress_bucket: int = 512
    error_feedback: str = "auto"
    momentum_correction: str = "auto"
    feedback: bool = False


@dataclass(frozen=True)
class Compensation:
    """The servers' staleness compensation (:mod:`psgd.ps.compensation`): in a
    :class:`ProtocolConfig`, ``staleness_comp`` is the method that runs (``auto`` resolved)."""

    staleness_comp: str | None = None
    comp_lambda: float | None = None   # DC-ASGD's lambda_0 (None: the method's default)
    staleness_lr: str = "none"         # the older spelling of --staleness-comp inverse


@dataclass(frozen=True)
class Recording:
    """``--record FILE`` / ``--replay FILE``: the servers' order of events (:mod:`psgd.ps.order`)."""

    record: str | None = None
    replay: str | None = None


@dataclass(frozen=True)
class HotRows:
    """Sparse hogwild's held hot rows (:mod:`psgd.hogwild.hot`); ``hold_hot`` None or 1: none."""

    hold_hot: int | None = None
    hot_touch: float | None = None   # a row is hot above this chance of a batch touching it


@dataclass(frozen=True)
class ProtocolConfig:
    """Settings of one run, identical on every rank (made by :func:`psgd.protocols.make_config`).

    Attributes
    ----------
    protocol : str
        The protocol's name, for messages.
    n_params : int
        Length of the flat parameter vector.
    optimizer : str
        Optimizer name for :func:`psgd.nn.optim.make_optimizer`.
    opt_hparams : dict
        Keyword arguments for :func:`psgd.nn.optim.make_optimizer` (momentum, weight_decay, ...).
    lr_schedule : callable
        ``lr_schedule(clock) -> float``: the learning rate of an update computed at ``clock``.
    staleness : float
        The staleness bound in force, in clocks: a pull for clock c is answered
        once every worker has pushed clock c - staleness (0 for bsp, inf for asp).
    staleness_auto : bool
        ``--staleness auto``: the servers set the bound online
        (:mod:`psgd.ps.adaptive`) within [1, staleness].
    overlap : bool
        Workers pull the next parameters during the computation (needs staleness >= 1).
    update_rule : type or None
        A parameter server's update rule (:class:`psgd.ps.bsp.BspUpdate`,
        :class:`psgd.ps.ssp.SspUpdate`); None outside the parameter-server family.
    snapshot_every : int
        Servers snapshot their shard (params + optimizer state) every this many
        clocks for checkpoints; 0 = never.
    skip_nonfinite : bool
        Skip (and count) pushes holding NaN/Inf instead of failing the job.
    topology : str or None
        The decentralized protocols' graph (:mod:`psgd.gossip.topology`); None elsewhere.
    push_window : bool
        A worker's pushes to the servers of its own node go through shared
        memory (:mod:`psgd.ps.push_window`); False keeps them to messages
        (``psgd train`` reads ``PSGD_X_PS_PUSH_WINDOW`` once, at set-up).
    seed : int
        The run's seed (workers' random rounding in qsgd; AD-PSGD's pairings).
    worker_momentum : dict or None
        Momentum correction (:mod:`psgd.compress.momentum`): each worker's
        ``WorkerMomentum(n, **worker_momentum)`` turns its gradient into what it
        sends, and ``opt_hparams`` then hold momentum and weight decay 0.
    momentum_gain : float
        ``--momentum-correction gain`` (:mod:`psgd.compress.gain`): the momentum
        whose gain ``1 / (1 - momentum)`` ``lr_schedule`` already holds, the
        servers stepping plain SGD; 0: not in force.
    replay_events : tuple of ndarray or None
        ``--replay``: each shard's recorded events, to handle in that order (on the servers).
    compression, compensation, recording, hot_rows
        The features' options as the plan resolved them (:class:`Compression`,
        :class:`Compensation` with the method that runs, :class:`Recording`, :class:`HotRows`).
    """

    protocol: str
    n_params: int
    optimizer: str = "sgd"
    opt_hparams: dict = field(default_factory=dict)
    lr_schedule: Callable[[int], float] = lambda clock: 0.01
    staleness: float = 0.0
    staleness_auto: bool = False
    overlap: bool = False
    update_rule: type | None = None
    snapshot_every: int = 0
    skip_nonfinite: bool = False
    topology: str | None = None
    push_window: bool = True
    seed: int = 0
    worker_momentum: dict | None = None
    momentum_gain: float = 0.0
    replay_events: tuple | None = None
    compression: Compression = Compression()
    compensation: Compensation = Compensation(staleness_comp="none")
    recording: Recording = Recording()
    hot_rows: HotRows = HotRows()

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {self.staleness}")
        if self.overlap and self.staleness < 1:
            raise ValueError(f"overlap needs a staleness bound >= 1, got {self.staleness:g}")
        lam = self.compensation.comp_lambda
        if lam is not None and not lam >= 0:
            raise ValueError(f"--comp-lambda must be >= 0, got {lam}")
