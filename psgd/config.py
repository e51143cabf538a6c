"""What every protocol family is told: the settings of one run that servers and workers share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass
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
    staleness_comp : str
        The staleness compensation the servers (or hogwild's workers) run:
        ``none``, ``inverse``, ``dcasgd``, ``gap``, ``amom`` or ``dana``
        (:mod:`psgd.ps.compensation`).
    comp_lambda : float or None
        DC-ASGD's lambda_0 (None: the method's default).
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
    record : bool
        Servers write down the order of their events (``--record``, :mod:`psgd.ps.order`).
    replay : tuple of ndarray or None
        Each shard's recorded events, to handle in that order (``--replay``).
    compress : str
        The pushes' compressor (``--compress``, :mod:`psgd.compress`); ``none``.
    compress_bucket : int
        Elements per bucket for qsgd's norms and sign's scales.
    error_feedback : bool
        Workers keep the compression residual and add it to the next push.
    worker_momentum : dict or None
        Momentum correction (:mod:`psgd.compress.momentum`): each worker's
        ``WorkerMomentum(n, **worker_momentum)`` turns its gradient into what it
        sends, and ``opt_hparams`` then hold momentum and weight decay 0.
    momentum_gain : float
        ``--momentum-correction gain`` (:mod:`psgd.compress.gain`): the momentum
        whose gain ``1 / (1 - momentum)`` ``lr_schedule`` already holds, the
        servers stepping plain SGD; 0: not in force.
    seed : int
        The run's seed (workers' random rounding in qsgd; AD-PSGD's pairings).
    hold_hot : int
        Sparse hogwild: steps a worker holds its changes to its hot rows
        (:mod:`psgd.hogwild.hot`); 1: none held.
    """

    protocol: str
    n_params: int
    optimizer: str = "sgd"
    opt_hparams: dict = field(default_factory=dict)
    lr_schedule: Callable[[int], float] = lambda clock: 0.01
    staleness: float = 0.0
    staleness_auto: bool = False
    staleness_comp: str = "none"
    comp_lambda: float | None = None
    overlap: bool = False
    update_rule: type | None = None
    snapshot_every: int = 0
    skip_nonfinite: bool = False
    topology: str | None = None
    push_window: bool = True
    record: bool = False
    replay: tuple | None = None
    compress: str = "none"
    compress_bucket: int = 512
    error_feedback: bool = False
    worker_momentum: dict | None = None
    momentum_gain: float = 0.0
    seed: int = 0
    hold_hot: int = 1

    def __post_init__(self) -> None:
        if self.staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {self.staleness}")
        if self.overlap and self.staleness < 1:
            raise ValueError(f"overlap needs a staleness bound >= 1, got {self.staleness:g}")
        if self.comp_lambda is not None and not self.comp_lambda >= 0:
            raise ValueError(f"--comp-lambda must be >= 0, got {self.comp_lambda}")
