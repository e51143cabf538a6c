"""What every protocol family is told: the settings of one run that servers and workers share.

:class:`ProtocolConfig` holds the protocol-level settings and, as they are, the run plan's
options of the features the halves read (:mod:`psgd.protocols.features`: one class each, its
fields its flags), so a feature's flag reaches a half without passing through the job.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class ProtocolConfig:
    """Settings of one run, identical on every rank (made by :meth:`psgd.protocols.Protocol.config`).

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
    replayed_before : tuple of ndarray or None
        A resumed ``--replay``: each shard's recorded events before the resumed step, whose
        delays the update rule counts again into its compensation's running means.
    hold_at_snapshots : bool
        A pull for a clock that is a multiple of ``snapshot_every`` waits until every
        worker's push of the clock before is in, so each snapshot holds exactly the pushes
        of the clocks it names (ssp/asp; a pipeline's stage servers).
    compression, compensation, recording, hot_rows
        The features' options as the plan resolved them (``psgd.protocols.features``:
        ``CompressionOptions``, ``CompensationOptions`` holding the method that runs,
        ``RecordOptions``, ``HotRowOptions``; :func:`psgd.protocols.features.make_config` gives
        the defaults); None where no half of the run reads them.
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
    replayed_before: tuple | None = None
    hold_at_snapshots: bool = False
    compression: Any = None
    compensation: Any = None
    recording: Any = None
    hot_rows: Any = None

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {self.staleness}")
        if self.overlap and self.staleness < 1:
            raise ValueError(f"overlap needs a staleness bound >= 1, got {self.staleness:g}")
