"""The options of `psgd train`'s features that no protocol half reads (timeline and tensorboard,
stragglers); those the halves read are in :mod:`psgd.protocols.features`."""
from __future__ import annotations

from dataclasses import dataclass

from psgd.errors import UsageError
from psgd.protocols.options import Options
from psgd.run import straggler


@dataclass(frozen=True)
class TraceOptions(Options):
    """What a run writes besides its metrics log: a timeline, TensorBoard events."""

    KEY, TITLE = "traces", "timeline and tensorboard"
    FLAGS = {
        "timeline": (str, "write every rank's compute, push, wait, pull, all-reduce and server "
                          "spans to this Chrome trace JSON file (Perfetto, chrome://tracing)"),
        "tensorboard": (str, "also write the metrics as TensorBoard event files into this "
                             "directory (tensorboardX: pip install 'psgd[tensorboard]')"),
    }

    timeline: str | None = None
    tensorboard: str | None = None

    def resolved(self, plan, protocol) -> TraceOptions:
        if self.tensorboard:
            from psgd.run.tb_events import check_dir
            check_dir(self.tensorboard)
        return self


@dataclass(frozen=True)
class StragglerOptions(Options):
    """Emulated slow workers (psgd.run.straggler)."""

    KEY, TITLE = "stragglers", "stragglers"
    FLAGS = {
        "straggler": (str, "emulate stragglers: " + straggler.FORMAT + "; slow=f: the worker's "
                           "compute takes f times as long (it sleeps (f - 1) x its compute after "
                           "each step), p=q,d=t: each step pauses t seconds (d=5x: 5 x its mean "
                           "compute time) with probability q, seeded by --seed; e.g. "
                           "'1:slow=3' or 'all:p=0.1,d=5x'"),
        "straggler_seed": (int, "seed of --straggler's pauses (default --seed): other steps "
                                "pause while the data order and initialisation stay"),
    }

    straggler: str | None = None
    straggler_seed: int | None = None

    def resolved(self, plan, protocol) -> StragglerOptions:
        straggler.parse(self.straggler)   # the worker indices are checked against the job's
        if self.straggler_seed is not None and not self.straggler:
            raise UsageError("--straggler-seed applies with --straggler")
        return self

    def make(self, seed: int, worker: int, n_workers: int):
        """Worker ``worker``'s :class:`psgd.run.straggler.Straggler`, or None (not slowed);
        its pauses drawn from ``--straggler-seed``, else the run's ``seed``."""
        own = seed if self.straggler_seed is None else self.straggler_seed
        return straggler.make(self.straggler, own, worker, n_workers)


