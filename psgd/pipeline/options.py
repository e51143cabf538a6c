"""`psgd train --pipeline`'s flags: parsed, checked, and the settings they cannot run with."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from psgd.pipeline.schedules import ASYNCHRONOUS, SCHEDULES

AUTO = "auto"
_NO_SERVERS = "its protocol combines the stage replicas without servers"
_FIXED_ORDER = ("every schedule, pipedream and pipemare included, fixes each stage's op order "
                "and the weight version each microbatch sees, so a run repeats bit-exactly "
                "whatever its timing: nothing to {}")
# settings of `psgd train` that a pipeline does not run: their flags are refused (the first
# SERVER_SETTINGS only where a parameter-server protocol combines the stage replicas)
REFUSED = {
    "servers": _NO_SERVERS,
    "staleness": _NO_SERVERS,
    "staleness_max": _NO_SERVERS,
    "staleness_comp": _NO_SERVERS,
    "comp_lambda": _NO_SERVERS,
    "staleness_lr": _NO_SERVERS,
    "overlap": "the schedule decides what overlaps",
    "topology": "the stage replicas combine their gradients by all-reduce or servers",
    "compress": "the stage replicas send uncompressed gradients",
    "error_feedback": "nothing is compressed",
    "momentum_correction": "nothing is compressed",
    "straggler": "straggler emulation runs in the data-parallel worker loop only",
    "record": _FIXED_ORDER.format("record"),
    "replay": _FIXED_ORDER.format("replay"),
    "tensorboard": "not written by pipeline runs yet",
    "eval_every": "a pipeline run evaluates once, at the end",
    "hold_hot": "sparse models are not cut into stages",
    "skip_nonfinite": "a stage cannot skip a microbatch the others computed",
}


@dataclass(frozen=True)
class PipelineOptions:
    """K stages, M microbatches per batch, the schedule, the cut and the memory cap per rank."""

    stages: int
    microbatches: int = 1
    schedule: str = "1f1b"
    partition: str = AUTO           # auto, or layer-unit counts per stage "3,2,4"
    memory_per_rank: int | None = None   # bytes; None: no cap
    stash: bool = True              # pipedream: weight stashing
    vertical_sync: bool = False     # pipedream: every stage runs a microbatch on stage 0's version
    anneal: int | None = None       # pipemare: rescheduling steps (None: a quarter of the run; 0: off)
    correct: bool = True            # pipemare: discrepancy correction
    recompute: bool = True          # each backward re-runs its forward (off: keep activations)

    def counts(self) -> list[int] | None:
        """The ``--partition`` counts, or None for ``auto``."""
        if self.partition == AUTO:
            return None
        try:
            counts = [int(t) for t in self.partition.split(",")]
        except ValueError:
            raise ValueError(f"--partition must be auto or unit counts per stage like 3,2,4, "
                             f"got {self.partition!r}") from None
        if len(counts) != self.stages or min(counts) < 1:
            raise ValueError(f"--partition {self.partition} must give {self.stages} positive "
                             f"counts, one per stage (--pipeline {self.stages})")
        return counts

    def check(self, batch_size: int) -> None:
        """Raise ValueError naming the flag when the options cannot run with ``batch_size``."""
        if self.stages < 1:
            raise ValueError(f"--pipeline needs K >= 1 stages, got {self.stages}")
        if self.microbatches < 1:
            raise ValueError(f"--microbatches needs M >= 1, got {self.microbatches}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown --schedule {self.schedule!r}; choose one of "
                             f"{', '.join(SCHEDULES)}")
        if batch_size % self.microbatches:
            raise ValueError(f"--microbatches {self.microbatches} does not divide --batch-size "
                             f"{batch_size}")
        if self.vertical_sync and (self.schedule != "pipedream" or not self.stash):
            raise ValueError("--vertical-sync applies to --schedule pipedream with weight stashing")
        if not self.stash and self.schedule != "pipedream":
            raise ValueError(f"--weight-stashing applies to --schedule pipedream, not "
                             f"{self.schedule}")
        if not self.recompute and (self.schedule == "pipemare" or not self.stash):
            raise ValueError(f"--recompute off needs the backward on its forward's weights; "
                             f"{self.schedule}{'' if self.stash else ' without weight stashing'} "
                             f"runs it on newer ones (use gpipe, 1f1b or pipedream with stashing)")
        if (self.anneal is not None or not self.correct) and self.schedule != "pipemare":
            flag = "--pipemare-anneal" if self.anneal is not None else "--discrepancy-correction"
            raise ValueError(f"{flag} applies to --schedule pipemare, not {self.schedule}")
        if self.anneal is not None and self.anneal < 0:
            raise ValueError(f"--pipemare-anneal needs N >= 0 steps, got {self.anneal}")
        if self.memory_per_rank is not None and self.memory_per_rank <= 0:
            raise ValueError(f"--memory-per-rank must be positive bytes, got {self.memory_per_rank}")
        self.counts()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The pipeline's flags on ``psgd train``."""
    group = parser.add_argument_group("pipeline parallelism (docs/guide/pipeline.md)")
    group.add_argument("--pipeline", type=int, metavar="K", default=None,
                       help="cut the model into K contiguous stages, one rank each; "
                            "ranks = D replicas x K")
    group.add_argument("--microbatches", type=int, metavar="M", default=None,
                       help="microbatches per batch (must divide --batch-size; default 1)")
    group.add_argument("--schedule", default=None, metavar="S",
                       help=f"pipeline schedule: {', '.join(SCHEDULES)} (default 1f1b)")
    group.add_argument("--partition", default=None, metavar="CUT",
                       help="auto (balance profiled layer costs; default) or layer-unit "
                            "counts per stage, e.g. 3,2,4")
    group.add_argument("--weight-stashing", choices=("on", "off"), default=None,
                       help="pipedream: each backward runs on the weights its forward used "
                            "(on, the default); off shows what stashing corrects")
    group.add_argument("--vertical-sync", action="store_true", default=None,
                       help="pipedream: every stage runs microbatch g on its weights after "
                            "g - (K - 1) updates, the version stage 0 used (PipeDream's "
                            "vertical sync)")
    group.add_argument("--pipemare-anneal", type=int, default=None, metavar="N",
                       help="pipemare: stage s's rate rises from lr / (K - s - 1) to lr over N "
                            "microbatch steps (PipeMare's rescheduling; default a quarter of "
                            "the run, 0: off)")
    group.add_argument("--discrepancy-correction", choices=("on", "off"), default=None,
                       help="pipemare: each backward runs on an estimate of its forward's "
                            "weights (on, the default)")
    group.add_argument("--recompute", choices=("on", "off"), default=None,
                       help="on (default): a stage keeps each in-flight microbatch's input and "
                            "re-runs its forward before the backward (least memory); off: it "
                            "keeps every layer's activations and runs each forward once")
    group.add_argument("--memory-per-rank", type=_bytes, default=None, metavar="BYTES",
                       help="auto partition: each stage's parameters, gradients and stored "
                            "activations must fit (e.g. 200M, 2G)")


def _bytes(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    scale = units.get(text[-1:].lower(), 1)
    try:
        return int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 200M)") from None


def from_args(args: argparse.Namespace) -> PipelineOptions | None:
    """The options of ``args`` (None without --pipeline); a pipeline flag alone is an error."""
    given = [f for f in ("microbatches", "schedule", "partition", "memory_per_rank",
                         "weight_stashing", "vertical_sync", "pipemare_anneal",
                         "discrepancy_correction", "recompute")
             if getattr(args, f, None) is not None]
    if getattr(args, "pipeline", None) is None:
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise ValueError(f"{flag} applies to pipeline runs; give --pipeline K")
        return None
    return PipelineOptions(stages=args.pipeline, microbatches=args.microbatches or 1,
                           schedule=args.schedule or "1f1b", partition=args.partition or AUTO,
                           memory_per_rank=args.memory_per_rank,
                           stash=getattr(args, "weight_stashing", None) != "off",
                           vertical_sync=bool(getattr(args, "vertical_sync", None)),
                           anneal=getattr(args, "pipemare_anneal", None),
                           correct=getattr(args, "discrepancy_correction", None) != "off",
                           recompute=getattr(args, "recompute", None) != "off")


SERVER_SETTINGS = ("servers", "staleness", "staleness_max", "staleness_comp", "comp_lambda",
                   "staleness_lr")


def refused(args: argparse.Namespace, servers: bool = False) -> str | None:
    """One line for the first flag given that a pipeline run does not run, else None
    (``servers``: the protocol has parameter servers, which take their own flags)."""
    for name, why in REFUSED.items():
        if servers and name in SERVER_SETTINGS:
            continue
        if getattr(args, name, None) not in (None, False):
            return f"--{name.replace('_', '-')} does not work under --pipeline: {why}"
    return None
