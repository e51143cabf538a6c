"""The options of `psgd train`'s two other modes, a pipeline (--pipeline K) and an elastic server
job (--elastic): their flags, TOML keys and PSGD_<NAME> variables like every feature's."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from psgd.errors import UsageError
from psgd.pipeline.options import AUTO as PARTITION_AUTO, REFUSED, PipelineOptions
from psgd.pipeline.schedules import SCHEDULES
from psgd.protocols import AUTO, names
from psgd.protocols.options import Options

DEFAULT_MAX_WORKERS = 16
DEFAULT_NO_WORKER_S = 300.0
_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


class NotBytes(argparse.ArgumentTypeError, ValueError):
    """A --memory-per-rank that is no byte count (argparse prints its message; a TOML key or a
    variable's is a usage line like any bad setting's)."""


def byte_count(text) -> int:
    """``200M``, ``2G``, ``4096`` (or an int from TOML) as bytes; :class:`NotBytes` otherwise."""
    if isinstance(text, int):
        return text
    scale = _UNITS.get(str(text)[-1:].lower(), 1)
    try:
        return int(float(text[:-1] if scale > 1 else text) * scale)
    except ValueError:
        raise NotBytes(f"not a byte count: {text!r} (e.g. 200M)") from None


def _on_off(flag: str, value: str | None) -> None:
    if value not in (None, "on", "off"):
        raise UsageError(f"--{flag} must be on or off, got {value!r}")


@dataclass(frozen=True)
class PipelineFlags(Options):
    """The model cut into stages, one rank each (psgd.pipeline); ``options()`` is the run's
    :class:`psgd.pipeline.options.PipelineOptions`."""

    KEY, TITLE = "pipeline", "pipeline parallelism (docs/guide/pipeline.md)"
    REFUSES = REFUSED
    FLAGS = {
        "pipeline": (int, "cut the model into K contiguous stages, one rank each; "
                          "ranks = D replicas x K", "K"),
        "microbatches": (int, "microbatches per batch (must divide --batch-size; default 1)",
                         "M"),
        "schedule": (str, f"pipeline schedule: {', '.join(SCHEDULES)} (default 1f1b)", "S"),
        "partition": (str, "auto (balance profiled layer costs; default) or layer-unit counts "
                           "per stage, e.g. 3,2,4", "CUT"),
        "weight_stashing": (str, "on or off, pipedream: each backward runs on the weights its "
                                 "forward used (on, the default); off shows what stashing "
                                 "corrects", "on|off"),
        "vertical_sync": (bool, "pipedream: every stage runs microbatch g on its weights after "
                                "g - (K - 1) updates, the version stage 0 used (PipeDream's "
                                "vertical sync)"),
        "pipemare_anneal": (int, "pipemare: stage s's rate rises from lr / (K - s - 1) to lr "
                                 "over N microbatch steps (PipeMare's rescheduling; default a "
                                 "quarter of the run, 0: off)", "N"),
        "discrepancy_correction": (str, "on or off, pipemare: each backward runs on an estimate "
                                        "of its forward's weights (on, the default)",
                                   "on|off"),
        "stage_comp": (str, "pipedream or pipemare: each stage rewrites its steps with psgd's "
                            "staleness compensation for its delay of K - s - 1 updates: none "
                            "(default), inverse, amom, dcasgd or gap (the last two need the "
                            "forward's weights: pipedream's stash or pipemare's correction)",
                       "METHOD"),
        "recompute": (str, "on: a stage keeps each in-flight microbatch's input and re-runs "
                           "its forward before the backward (least memory); off: it keeps every "
                           "layer's activations and runs each forward once; auto (default): off "
                           "unless the schedule needs on (pipemare, pipedream without stashing) "
                           "or no cut keeping activations fits --memory-per-rank",
                      "auto|on|off"),
        "memory_per_rank": (byte_count, "auto partition: each stage's parameters, gradients and "
                                        "stored activations must fit (e.g. 200M, 2G)",
                           "BYTES"),
    }

    pipeline: int | None = None
    microbatches: int | None = None
    schedule: str | None = None
    partition: str | None = None
    weight_stashing: str | None = None
    vertical_sync: bool | None = None
    pipemare_anneal: int | None = None
    discrepancy_correction: str | None = None
    stage_comp: str | None = None
    recompute: str | None = None
    memory_per_rank: int | None = None

    def check_given(self) -> None:
        """UsageError for a pipeline flag without --pipeline, or an on/off flag that is neither
        (what needs no other setting: checked before MPI starts, too)."""
        if self.pipeline is None:
            given = [n for n in self.FLAGS if getattr(self, n) not in (None, False)]
            if given:
                raise UsageError(f"--{given[0].replace('_', '-')} applies to pipeline runs; "
                                 f"give --pipeline K")
        _on_off("weight-stashing", self.weight_stashing)
        _on_off("discrepancy-correction", self.discrepancy_correction)
        if self.recompute not in (None, "auto", "on", "off"):
            raise UsageError(f"--recompute must be auto, on or off, got {self.recompute!r}")

    def options(self) -> PipelineOptions | None:
        """The run's pipeline options (None without --pipeline), defaults filled."""
        if self.pipeline is None:
            return None
        return PipelineOptions(stages=self.pipeline, microbatches=self.microbatches or 1,
                               schedule=self.schedule or "1f1b", partition=self.partition or PARTITION_AUTO,
                               memory_per_rank=self.memory_per_rank,
                               stash=self.weight_stashing != "off",
                               vertical_sync=bool(self.vertical_sync),
                               anneal=self.pipemare_anneal,
                               correct=self.discrepancy_correction != "off",
                               recompute={"on": True, "off": False}.get(self.recompute),
                               comp=self.stage_comp or "none")

    def resolved(self, plan, protocol) -> PipelineFlags:
        self.check_given()
        opts = self.options()
        if opts is not None:
            opts.check(plan.batch_size)
            protocol.check_pipeline(opts.schedule)
        return self


@dataclass(frozen=True)
class ElasticOptions(Options):
    """The servers alone, workers joining and leaving (psgd.elastic)."""

    KEY, TITLE = "elastic", "elastic training"
    FLAGS = {
        "elastic": (bool, "run as the server job of an elastic run (--protocol "
                          + names(able="elastic") + "; the servers only: mpiexec -n S, "
                          "--servers S): workers join with `psgd join --port-file F` from "
                          "mpiexec -n 1 jobs of their own and leave while it trains, a worker "
                          "silent longer than --stall-timeout is dropped, and --steps or "
                          "--epochs count the servers' updates over all workers "
                          "(docs/guide/elastic.md); --protocol " + names(able="elastic-ring")
                          + " or " + names(able="elastic-pairs") + " or "
                          + names(able="elastic-windows")
                          + ": the coordinator alone (mpiexec -n 1), the workers starting once "
                          "--max-workers W have joined, going on without a lost one, at one "
                          "node"),
        "port_file": (str, "--elastic: write the servers' MPI port name here; `psgd join "
                           "--port-file PATH` reads it (and knocks beside it)", "PATH"),
        "max_workers": (int, f"--elastic: the most workers that may join over the run, a lost "
                             f"one's place not reused (default {DEFAULT_MAX_WORKERS}; a ring: "
                             f"the workers it starts with)", "N"),
        "no_worker_timeout": (float, f"--elastic: end the run (with a checkpoint, exit 1) after "
                                     f"this long with no worker connected (default "
                                     f"{DEFAULT_NO_WORKER_S:g})", "SECONDS"),
        "replicas": (int, "--elastic asp or ssp, one server rank: 2 keeps a backup of the shard "
                          "(`psgd join --backup`, its own mpiexec -n 1) that each applied "
                          "update is forwarded to, and that takes over when the server job is "
                          "lost (default 1: a lost server ends the run)", "N"),
    }

    elastic: bool = False
    port_file: str | None = None
    max_workers: int | None = None
    no_worker_timeout: float | None = None
    replicas: int | None = None

    def check_given(self) -> None:
        """UsageError for an elastic flag without --elastic, or out of range (checked before
        MPI starts, too)."""
        given = [f"--{n.replace('_', '-')}" for n in ("port_file", "max_workers",
                                                      "no_worker_timeout", "replicas")
                 if getattr(self, n) is not None]
        if given and not self.elastic:
            raise UsageError(f"{given[0]} applies with --elastic only")
        if self.max_workers is not None and self.max_workers < 1:
            raise UsageError(f"--max-workers must be >= 1, got {self.max_workers}")
        if self.no_worker_timeout is not None and not self.no_worker_timeout > 0:
            raise UsageError(f"--no-worker-timeout must be > 0, got {self.no_worker_timeout}")
        if self.replicas is not None and self.replicas not in (1, 2):
            raise UsageError(f"--replicas is 1 or 2 (a primary and one backup), got "
                             f"{self.replicas}")

    def resolved(self, plan, protocol) -> ElasticOptions:
        self.check_given()
        if not self.elastic:
            return self
        from psgd.elastic import merged
        ring = merged(protocol)
        if not (protocol.can("elastic") or ring):
            raise UsageError(f"--elastic runs --protocol {names(able='elastic')} or "
                             f"{names(able='elastic-ring')} or {names(able='elastic-pairs')} "
                             f"or {names(able='elastic-windows')} so far, not "
                             f"{protocol.name}{protocol.why_not('elastic')}")
        if plan.split.wanted():
            raise UsageError("--elastic runs the whole model on every worker: not with "
                             "--tensor, --spatial or --grid")
        if not self.port_file:
            raise UsageError("--elastic needs --port-file PATH: where the workers find the "
                             "servers (a shared file system across nodes)")
        if (self.replicas or 1) > 1:
            _check_replicas(plan, protocol)
        if ring:
            return self._filled(plan)
        if plan.staleness == AUTO:
            raise UsageError("--elastic runs a fixed --staleness s (the servers' online bound "
                             "follows a fixed set of workers): pass --staleness N")
        return self._filled(plan)

    def _filled(self, plan) -> ElasticOptions:
        filled = replace(self, max_workers=self.max_workers or DEFAULT_MAX_WORKERS,
                         replicas=self.replicas or 1,
                         no_worker_timeout=self.no_worker_timeout or DEFAULT_NO_WORKER_S)
        if filled.no_worker_timeout >= plan.stall_abort:
            raise UsageError("--no-worker-timeout must be below --stall-abort")
        return filled


def _check_replicas(plan, protocol) -> None:
    """UsageError, one line, for a replicated run that is not built: only the protocols able to
    "elastic-replicas", one server rank, no dana, not resumed."""
    if not protocol.can("elastic-replicas"):
        raise UsageError(f"--replicas 2 runs --elastic --protocol {names(able='elastic-replicas')} "
                         f"only, not {protocol.name} (no backup is built for it)")
    method = protocol.compensation(plan.compensation.staleness_comp, plan.optimizer)
    if method.startswith("dana"):   # auto's pick, too
        raise UsageError(f"--replicas 2 runs without --staleness-comp {method}: the backup "
                         f"does not follow its count of the live workers; pass "
                         f"--staleness-comp none, or --optimizer sgd")
    if (plan.servers or 1) != 1:
        raise UsageError("--replicas 2 runs one server rank (--servers 1): a backup for "
                         "several shards is not built")
    if plan.resume:
        raise UsageError("--replicas 2 does not resume (--resume): the backup starts from the "
                         "run's first parameters")
