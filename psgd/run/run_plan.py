"""The frozen plan of a `psgd train` run: its core settings and one options object per feature,
validated and filled in once at set-up; the job, the workers and the servers only read it."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Mapping

from psgd.errors import UsageError
from psgd.protocols import AUTO, get
from psgd.protocols.features import (HALF_FEATURES, CompensationOptions, CompressionOptions,
                                     HotRowOptions, RecordOptions)
from psgd.run.features import StragglerOptions, TraceOptions
from psgd.run.mode_flags import ElasticOptions, PipelineFlags
from psgd.run.optimizer_defaults import check_optimizer, fill_defaults
from psgd.run.tensor_flags import TensorOptions

#: the features, in the order they are resolved (each may read those before it)
FEATURES = (CompensationOptions, CompressionOptions, RecordOptions, TraceOptions,
            StragglerOptions, HotRowOptions, TensorOptions, PipelineFlags, ElasticOptions)


@dataclass(frozen=True)
class RunPlan:
    """Every setting of a training run: the core ones (one field per flag), then the features'."""

    data: str | None = None
    model: str = "lenet"
    protocol: str = "ssp"
    servers: int | None = None        # default: 1, or 0 for a protocol without servers
    staleness: int | str | None = None  # the bound, for protocols that take one (ssp: default 2),
                                        # or auto (psgd.ps.adaptive)
    staleness_max: int | None = None  # --staleness auto's largest bound (default 16)
    overlap: bool = False
    topology: str | None = None        # gossip, adpsgd: default ring
    optimizer: str | None = None      # default by model kind (DENSE_DEFAULT, SPARSE_DEFAULT)
    lr: float | None = None
    lr_schedule: str | None = None
    alpha: float | None = None        # --lr-schedule optimal's L2 penalty (default DEFAULT_ALPHA)
    warmup: int = 0
    lr_step_every: int = 0
    lr_gamma: float = 0.1
    momentum: float | None = None     # default 0.9 (0 for adagrad, which takes none)
    weight_decay: float = 0.0
    batch_size: int = 64
    epochs: float | None = None
    steps: int | None = None
    seed: int = 0
    eval_every: int = 0
    log_every: int = 20
    eval_samples: int = 0             # 0 = the whole test split
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    checkpoint_keep: int = 3
    resume: str | None = None
    log: str | None = None
    overwrite: bool = False
    quiet: bool = False
    stall_timeout: float = 60.0
    stall_abort: float = 600.0
    skip_nonfinite: bool = False
    augment: bool = False
    compensation: CompensationOptions = CompensationOptions()
    compression: CompressionOptions = CompressionOptions()
    recording: RecordOptions = RecordOptions()
    traces: TraceOptions = TraceOptions()
    stragglers: StragglerOptions = StragglerOptions()
    hot_rows: HotRowOptions = HotRowOptions()
    split: TensorOptions = TensorOptions()
    pipeline: PipelineFlags = PipelineFlags()
    elastic: ElasticOptions = ElasticOptions()

    @classmethod
    def from_flat(cls, values: Mapping) -> RunPlan:
        """The plan of flat settings (flag name -> value), as given: nothing filled or checked."""
        unknown = set(values) - set(FLAG_NAMES)
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        core = {name: values[name] for name in CORE if name in values}
        return cls(**core, **{f.KEY: f.from_flat(values) for f in FEATURES})

    def as_dict(self) -> dict:
        """Flag name -> value for every setting: the config record and the checkpoints' header."""
        out = {name: getattr(self, name) for name in CORE}
        for feature in FEATURES:
            out.update(getattr(self, feature.KEY).as_dict())
        return out

    def for_halves(self) -> dict:
        """The options of the features the protocol halves read, by field of
        :class:`psgd.config.ProtocolConfig` (``compression=plan.compression``, ...)."""
        return {feature.KEY: getattr(self, feature.KEY) for feature in HALF_FEATURES}


#: the core settings' names (the fields that are no feature)
CORE = tuple(f.name for f in fields(RunPlan) if f.name not in {x.KEY for x in FEATURES})
#: every setting's name: its flag, TOML key and PSGD_<NAME> variable
FLAG_NAMES = CORE + tuple(name for feature in FEATURES for name in feature.FLAGS)
#: every setting at its default
DEFAULTS = RunPlan()


def refused_by(mode, values: Mapping, keep: tuple = ()) -> str | None:
    """The line refusing the first setting of ``mode.REFUSES`` (a run mode's options) that
    ``values`` (flag name -> value) holds at other than its default, ``keep`` excepted; None
    when there is none."""
    defaults = DEFAULTS.as_dict()
    for name, why in mode.REFUSES.items():
        if name not in keep and values.get(name, defaults[name]) != defaults[name]:
            return mode.refusal(name, why)
    return None


def validate(given: RunPlan) -> RunPlan:
    """The plan with its defaults filled in and every feature resolved (``given`` is frozen and
    stays as it was); UsageError naming the first bad setting."""
    if given.data is None:
        raise UsageError("no dataset: pass --data FILE (make one with `python -m psgd data "
                         "synth -o FILE`)")
    if not os.path.exists(given.data):
        raise UsageError(f"--data {given.data}: no such file")
    protocol = get(given.protocol)
    plan = _core(given, protocol)
    for feature in FEATURES:
        options = getattr(plan, feature.KEY).resolved(plan, protocol)
        plan = replace(plan, **{feature.KEY: options})
    if plan.log and os.path.exists(plan.log) and not (plan.resume or plan.overwrite):
        raise UsageError(f"--log {plan.log} exists (another run's log): continue that run with "
                         f"--resume, replace the log with --overwrite, or give another --log")
    return plan


def _core(given: RunPlan, protocol) -> RunPlan:
    """``given`` with its core settings checked and filled."""
    s = replace(given, servers=int(protocol.servers) if given.servers is None else given.servers)
    s = replace(s, **fill_defaults(s))
    bound = protocol.check(staleness=s.staleness, overlap=s.overlap, optimizer=s.optimizer,
                           n_servers=s.servers, staleness_max=s.staleness_max,
                           topology=s.topology)
    if s.staleness == AUTO:
        s = replace(s, staleness_max=int(bound))
    elif protocol.bound is None:
        s = replace(s, staleness=int(bound))
    s = replace(s, **check_optimizer(s, protocol.can("hot-rows")))
    _check_numbers(s)
    return replace(s, log_every=s.log_every or 1)


def _check_numbers(s) -> None:
    """UsageError naming the first numeric setting out of its range."""
    if s.lr is not None and not (math.isfinite(s.lr) and s.lr > 0):
        raise UsageError(f"--lr must be a positive number, got {s.lr}")
    if not 0 <= s.momentum < 1:
        raise UsageError(f"--momentum must be in [0, 1), got {s.momentum}")
    if s.weight_decay < 0:
        raise UsageError(f"--weight-decay must be >= 0, got {s.weight_decay}")
    if s.batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {s.batch_size}")
    if s.epochs is not None and s.steps is not None:
        raise UsageError("give --epochs or --steps, not both")
    if s.epochs is not None and not s.epochs > 0:
        raise UsageError(f"--epochs must be > 0, got {s.epochs}")
    if s.steps is not None and s.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {s.steps}")
    for name in ("eval_every", "log_every", "checkpoint_every", "checkpoint_keep", "warmup",
                 "eval_samples"):
        if getattr(s, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(s, name)}")
    if s.checkpoint_every and not s.checkpoint_dir:
        raise UsageError("--checkpoint-every needs --checkpoint-dir")
    if s.stall_timeout <= 0 or s.stall_abort <= 0:
        raise UsageError("--stall-timeout and --stall-abort must be > 0")
