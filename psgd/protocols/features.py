"""The options of the features that protocol halves read (compression, staleness compensation,
record and replay, hot rows): each owns its flags, checks itself against the protocol's declared
abilities, and reaches the halves as it is (``config.compression.compress``)."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from psgd import compress
from psgd.errors import UsageError
from psgd.hogwild import DEFAULT_HOLD
from psgd.nn.sparse import is_sparse_spec
from psgd.protocols.momentum import mode as momentum_mode
from psgd.protocols.options import Options
from psgd.protocols.registry import get, names
from psgd.ps import compensation
from psgd.ps.compensation import amom


@dataclass(frozen=True)
class CompensationOptions(Options):
    """How the servers correct a stale update (psgd.ps.compensation)."""

    KEY, TITLE = "compensation", "staleness compensation"
    FLAGS = {
        "staleness_comp": (str, "staleness compensation on the servers: " + "; ".join(
            f"{name} ({text})" for name, text in compensation.help_items().items())
            + f" (default auto for {names(compensations=None)} and hogwild, "
              f"none where steps are never stale)"),
        "comp_lambda": (float, f"dcasgd's lambda_0 >= 0 (default "
                               f"{compensation.DEFAULT_LAMBDA:g})"),
        "staleness_lr": (str, "none, or inverse: the older spelling of --staleness-comp inverse"),
        "amom_warmup": (int, f"amom: its learning rate ramps up linearly over the first N x W "
                             f"updates of W workers (default {amom.WARMUP_PER_WORKER}; 0: full "
                             f"rate from the first)", "N"),
    }

    staleness_comp: str | None = None  # in a ProtocolConfig: the method that runs (auto resolved)
    comp_lambda: float | None = None   # DC-ASGD's lambda_0 (None: the method's default)
    staleness_lr: str = "none"         # the older spelling of --staleness-comp inverse
    amom_warmup: int | None = None     # None: amom.WARMUP_PER_WORKER

    def resolved(self, plan, protocol) -> CompensationOptions:
        if self.staleness_lr not in ("none", "inverse"):
            raise UsageError(f"--staleness-lr {self.staleness_lr!r} is not none or inverse")
        method = self.staleness_comp
        if self.staleness_lr == "inverse":
            if method not in (None, "inverse"):
                raise UsageError(f"--staleness-lr inverse and --staleness-comp {method} "
                                 f"disagree: give --staleness-comp only")
            method = "inverse"
        runs = protocol.compensation(method, plan.optimizer, self.comp_lambda)
        if self.amom_warmup is not None and (runs != "amom" or self.amom_warmup < 0):
            raise UsageError(f"--amom-warmup takes N >= 0 updates per worker with "
                             f"--staleness-comp amom, not {self.amom_warmup} with {runs}")
        return replace(self, staleness_comp=method or protocol.default_compensation())


@dataclass(frozen=True)
class CompressionOptions(Options):
    """What each push is compressed to, and where the momentum and the residual live."""

    KEY, TITLE = "compression", "compression"
    FLAGS = {
        "compress": (str, "compress every push (" + names(able="compress") + "): " + "; ".join(
            f"{k} ({v})" for k, v in compress.HELP.items()) + " (default none)"),
        "compress_bucket": (int, "elements per bucket of qsgd's norms and sign's scales "
                                 "(default 512)"),
        "error_feedback": (str, "auto, on or off: keep what compression dropped and add it to "
                                "the next push (auto: on for topk and sign)"),
        "momentum_correction": (str, "auto, on, off or gain: on: each worker keeps the momentum "
                                     "of its own gradients and pushes that velocity; the servers "
                                     "(or the average) then take a plain step (Deep Gradient "
                                     "Compression's momentum correction; under ssp and asp the "
                                     "velocity takes the momentum --staleness-comp amom sets; "
                                     + names(able="momentum-correction") + " with "
                                     "--optimizer momentum or nesterov); gain ("
                                     + names(able="momentum-gain") + "): the servers step plain "
                                     "SGD at lr / (1 - momentum) on the pushed gradients; auto: "
                                     "where error feedback runs, gain under "
                                     + names(able="momentum-gain") + " with sign, else on"),
    }

    compress: str = "none"
    compress_bucket: int = 512
    error_feedback: str = "auto"
    momentum_correction: str = "auto"   # the job turns it into ProtocolConfig.worker_momentum
                                         # and .momentum_gain (psgd.protocols.momentum)
    feedback: bool = False               # error feedback in force: derived from the flags

    def __post_init__(self) -> None:
        """``feedback``, error feedback in force, follows from the flags (a bad --compress
        leaves it off: :meth:`resolved` names it)."""
        try:
            on = compress.feedback_on(self.compress, self.error_feedback, self.compress_bucket)
        except ValueError:
            on = False
        object.__setattr__(self, "feedback", on)

    def check(self, protocol) -> None:
        """UsageError when ``protocol`` has not the abilities these options need."""
        if self.compress != "none" and not protocol.can("compress"):
            raise UsageError(f"--compress {self.compress} applies to --protocol "
                             f"{names(able='compress')} (pushes to servers, the all-reduce), "
                             f"not {protocol.name}{protocol.why_not('compress')}")
        if self.error_feedback == "on" and \
                self.compress.partition(":")[0] in protocol.feedback_refused:
            raise UsageError(f"--error-feedback on does not apply to --compress {self.compress} "
                             f"under --protocol {protocol.name}{protocol.why_not('error-feedback')}")
        if self.momentum_correction == "gain" and not protocol.can("momentum-gain"):
            raise UsageError(f"--momentum-correction gain applies to --protocol "
                             f"{names(able='momentum-gain')}, whose step averages every "
                             f"worker's push of a clock, not {protocol.name}"
                             f"{protocol.why_not('momentum-gain')}")
        if self.momentum_correction == "on" and not protocol.can("momentum-correction"):
            raise UsageError(f"--momentum-correction on applies to --protocol "
                             f"{names(able='momentum-correction')}, whose workers can keep the "
                             f"momentum of the servers' step, not {protocol.name}"
                             f"{protocol.why_not('momentum-correction')}")

    def resolved(self, plan, protocol) -> CompressionOptions:
        self.check(protocol)
        compress.check(self.compress, self.compress_bucket, self.error_feedback)
        momentum_mode(protocol, self.momentum_correction, optimizer=plan.optimizer,
                      feedback=False, staleness_comp=plan.compensation.staleness_comp)
        return self


@dataclass(frozen=True)
class RecordOptions(Options):
    """The servers' order of pushes and pulls, written or followed."""

    KEY, TITLE = "recording", "record and replay"
    FLAGS = {
        "record": (str, f"write the servers' order of pushes and pulls to this HDF5 file "
                        f"({names(able='replay')}; see --replay)"),
        "replay": (str, "run again exactly as recorded: the same command with --replay FILE "
                        "(and its own --log) gives bit-identical parameters and losses"),
    }

    record: str | None = None
    replay: str | None = None

    def resolved(self, plan, protocol) -> RecordOptions:
        if self.record and self.replay:
            raise UsageError("give --record or --replay, not both")
        given = "--record" if self.record else "--replay" if self.replay else None
        if given and not protocol.can("replay"):
            raise UsageError(f"{given} does not apply to --protocol {protocol.name}"
                             f"{protocol.why_not('replay')}")
        if self.replay and not os.path.exists(self.replay):
            raise UsageError(f"--replay {self.replay}: no such file")
        return self


@dataclass(frozen=True)
class HotRowOptions(Options):
    """Sparse hogwild's held hot rows (psgd.hogwild)."""

    KEY, TITLE = "hot_rows", "sparse models"
    FLAGS = {
        "hold_hot": (int, "hogwild on sparse data: each worker adds its changes to the rows most "
                          "of its batches touch (the bias, the most frequent features) every N "
                          "steps instead of every step, and reads them back then: fewer writes "
                          "to the cache lines all workers share, those rows up to N steps stale "
                          f"(1: every step; default {DEFAULT_HOLD}; applies where the steps run "
                          "fused: --optimizer sgd or adagrad on one node, see "
                          "docs/design/hogwild.md)"),
        "hot_touch": (float, "with --hold-hot: a row is hot, and held, when a batch touches it "
                             "with a chance above F, 0 < F < 1 (default 0.5: more often than "
                             "not); lower holds more rows"),
    }

    hold_hot: int | None = None       # None or 1: no rows held
    hot_touch: float | None = None    # a row is hot above this chance of a batch touching it

    def resolved(self, plan, protocol) -> HotRowOptions:
        hold = self.hold_hot
        if hold is not None and hold < 1:
            raise UsageError(f"--hold-hot must be >= 1, got {hold}")
        if hold is not None and not protocol.can("hot-rows"):
            raise UsageError(f"--hold-hot applies to --protocol {names(able='hot-rows')} on "
                             f"sparse data, not {protocol.name}{protocol.why_not('hot-rows')}")
        sparse = is_sparse_spec(plan.model)   # the job checks the data against the model
        if hold is not None and not sparse:
            raise UsageError(f"--hold-hot applies to a sparse model (linear or svm on CSR "
                             f"data), not --model {plan.model}")
        touch = self.hot_touch
        if touch is not None and not 0 < touch < 1:
            raise UsageError(f"--hot-touch must be in (0, 1), got {touch}")
        if not (protocol.can("hot-rows") and sparse):
            if touch is not None:
                raise UsageError(f"--hot-touch applies with --hold-hot's held rows (--protocol "
                                 f"{names(able='hot-rows')} on sparse data)")
            return self
        return replace(self, hold_hot=DEFAULT_HOLD if hold is None else hold)


#: the features the protocol halves read: fields of :class:`psgd.config.ProtocolConfig`, passed
#: from the plan as they are
HALF_FEATURES = (CompressionOptions, CompensationOptions, RecordOptions, HotRowOptions)


def make_config(name: str, n_params: int, **settings):
    """``get(name).config(n_params, **settings)``, a validated
    :class:`psgd.config.ProtocolConfig` for protocol ``name``, a half feature not given taking
    its defaults."""
    features = {f.KEY: settings.pop(f.KEY, None) or f() for f in HALF_FEATURES}
    return get(name).config(n_params, **features, **settings)
