"""A pipeline run's options (psgd.run.mode_flags owns their flags), checked, and the settings
they cannot run with (REFUSED, which psgd.run.mode_flags.PipelineFlags declares)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from psgd.pipeline.schedules import ASYNCHRONOUS, SCHEDULES

AUTO = "auto"
_NO_SERVERS = "its protocol combines the stage replicas without servers"
_FIXED_ORDER = ("without servers there is no order to record: each stage's op order fixes "
                "everything, pipedream and pipemare included, so the run repeats bit-exactly "
                "whatever its timing")
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
    "record": _FIXED_ORDER,
    "replay": _FIXED_ORDER,
    "tensorboard": "not written by pipeline runs yet",
    "eval_every": "a pipeline run evaluates once, at the end",
    "hold_hot": "sparse models are not cut into stages",
    "skip_nonfinite": "a stage cannot skip a microbatch the others computed",
    # kept by psgd.run.pipeline_job where psgd.tensor.pipeline builds tensor-split stages
    "tensor": "tensor-split stages run --schedule gpipe or 1f1b without servers",
    "spatial": "stages split by image rows run without servers",
    "grid": "stages split their layers by --tensor T or --grid D,T, not a per-layer choice",
    "elastic": "a pipeline's stages are fixed ranks, none of which may leave",
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
    recompute: bool | None = None   # each backward re-runs its forward; False: keep activations;
                                    # None (auto): keep them where the schedule and the cap allow
    comp: str = "none"              # pipedream/pipemare: psgd's staleness compensation per stage

    @property
    def can_keep(self) -> bool:
        """Whether the schedule's backwards run on their forwards' weights (so kept
        activations are the right ones): not pipemare, not pipedream without stashing."""
        return self.schedule != "pipemare" and self.stash

    @property
    def recomputes(self) -> bool:
        """--recompute on, or auto where activations cannot be kept (auto is resolved against
        --memory-per-rank by :meth:`resolved` before a run)."""
        return self.recompute if self.recompute is not None else not self.can_keep

    def resolved(self, fits) -> "PipelineOptions":
        """These options with --recompute auto decided: off where the schedule allows and
        ``fits()`` (a cut keeping every stored microbatch's activations fits --memory-per-rank),
        else on."""
        if self.recompute is not None:
            return self
        return replace(self, recompute=not (self.can_keep and fits()))

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
        if self.recompute is False and not self.can_keep:
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
        check_comp(self)
        self.counts()


# psgd.ps.compensation's methods a stage runs on its own steps, and whether each needs the
# weights the gradient was computed on (the stash, or PipeMare's estimate of them)
STAGE_COMP = {"none": False, "inverse": False, "amom": False, "dcasgd": True, "gap": True}
_NO_PULL = "its look-ahead answers a worker's pull, and a stage pulls nothing"


def check_comp(options: PipelineOptions) -> None:
    """Raise ValueError naming --stage-comp when ``options`` cannot run its method."""
    name = options.comp
    if name == "none":
        return
    if name in ("dana", "dana-adam"):
        raise ValueError(f"--stage-comp {name} does not run on a pipeline stage: {_NO_PULL}")
    if name not in STAGE_COMP:
        raise ValueError(f"--stage-comp {name!r} is not one of {', '.join(STAGE_COMP)}")
    if options.schedule not in ASYNCHRONOUS:
        raise ValueError(f"--stage-comp applies to --schedule pipedream or pipemare, not "
                         f"{options.schedule} (its steps are not stale)")
    known = options.stash if options.schedule == "pipedream" else options.correct
    if STAGE_COMP[name] and not known:
        why = "weight stashing" if options.schedule == "pipedream" else "discrepancy correction"
        raise ValueError(f"--stage-comp {name} needs the weights each gradient was computed on: "
                         f"{options.schedule} has them only with {why} on")


SERVER_SETTINGS = ("servers", "staleness", "staleness_max", "staleness_comp", "comp_lambda",
                   "staleness_lr", "record", "replay")
