"""The flags of `psgd train`: flags, TOML config, PSGD_* variables and a resumed checkpoint's
settings resolved into one validated :class:`psgd.run.run_plan.RunPlan`."""
from __future__ import annotations

import argparse
import os
import textwrap
import tomllib
from dataclasses import dataclass
from pathlib import Path

from psgd.nn.optim import DEFAULT_ALPHA, OPTIMIZERS, SCHEDULES
from psgd.run.optimizer_defaults import DENSE_DEFAULT, SPARSE_DEFAULT, default_text
from psgd.protocols import AUTO, DEFAULT_STALENESS_MAX, PROTOCOLS, names
from psgd.protocols.features import CompensationOptions, RecordOptions
from psgd.run.features import TraceOptions
from psgd.run.mode_flags import ElasticOptions, PipelineFlags
from psgd.run.run_plan import FEATURES, FLAG_NAMES, RunPlan, validate
from psgd.run.tensor_flags import TensorOptions

# --staleness auto: the servers set the bound (--resume auto: psgd.run.checkpoint)


def _staleness(value):
    """--staleness: an integer, or auto."""
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return AUTO
    if isinstance(value, (bool, float)):
        raise ValueError(value)
    return int(value)


_staleness.__name__ = f"an integer or {AUTO}"   # for the messages of argparse and _coerce


def _protocol_help() -> str:
    lines = []
    for p in PROTOCOLS.values():
        lines += textwrap.wrap(p.summary, 79, break_on_hyphens=False,
                               initial_indent=f"  {p.name:<10} ",
                               subsequent_indent=" " * 13)
    return "\n".join(lines)


DESCRIPTION = f"""Train a model data-parallel over MPI. Launch one process per rank:

  mpiexec -n 3 python -m psgd train --data data.h5 --protocol ssp --servers 1
  srun python -m psgd train --config jobs/configs/ssp.toml

Ranks 0..S-1 are parameter servers (S = --servers), the rest are workers.
Protocols:
{_protocol_help()}
With --overlap ({names(able='overlap')}, with s >= 1) a worker asks for the next parameters as
soon as it holds the current ones, so the pull travels during its computation;
each update is then one clock staler (the bound s still holds).

Settings resolve as: command-line flag, then --config TOML file, then the
PSGD_<NAME> environment variable (e.g. PSGD_LR=0.05), then the default."""


#: each setting's environment variable, PSGD_<NAME> (psgd.env.KNOBS are the others)
FLAG_VARIABLES = frozenset(f"PSGD_{name.upper()}" for name in FLAG_NAMES)


# the core settings' flag name -> (type, help); bools are store_true flags
CORE_FLAGS: dict[str, tuple[type, str]] = {
    "data": (str, "HDF5 dataset (make one with `psgd data synth`)"),
    "model": (str, "model spec: a preset (lenet, cifar-cnn, resnet8, resnet20), "
                   "mlp:784-256-256-10, or layer tokens joined by '-' on the data's input shape, "
                   "e.g. conv:32x3:pad1-bn-relu-pool:2-flatten-dense:10 (see docs/guide/models.md; "
                   "default lenet); on sparse data linear or svm"),
    "protocol": (str, "consistency protocol: " + ", ".join(PROTOCOLS) + " (default ssp)"),
    "servers": (int, f"number of parameter-server ranks S (default 1; 0 for "
                     f"{names(servers=False)})"),
    "staleness": (_staleness, f"staleness bound s >= 0 in clocks ({names(bound=None)} only; "
                              f"default 2), or {AUTO}: the servers set s online from the "
                              f"workers' clock lag and step times, within [1, "
                              f"--staleness-max] (see docs/guide/protocols.md)"),
    "staleness_max": (int, f"the largest bound --staleness {AUTO} may set (default "
                           f"{DEFAULT_STALENESS_MAX})"),
    "overlap": (bool, f"{names(able='overlap')} with a staleness bound >= 1: pull the next "
                      f"parameters while computing (costs one clock of staleness; see docs/guide/protocols.md)"),
    "topology": (str, f"{names(decentralized=True)}: the workers' graph, one of ring, torus, "
                      f"exponential, complete (default ring)"),
    "optimizer": (str, "optimizer: " + ", ".join(OPTIMIZERS) + " (default by model kind: "
                       f"{default_text(DENSE_DEFAULT)} for dense models; for --model linear or "
                       f"svm given none of --optimizer, --lr, --lr-schedule: "
                       f"{default_text(SPARSE_DEFAULT)}, which trains L2-normalised TF-IDF text "
                       "with no tuning)"),
    "lr": (float, "learning rate (default by model kind, see --optimizer; refused with "
                  "--lr-schedule optimal, which sets its own)"),
    "lr_schedule": (str, "learning-rate schedule: " + ", ".join(SCHEDULES) + " (default by model "
                         "kind, see --optimizer; inverse-sqrt: lr / sqrt(1 + t); optimal: "
                         "scikit-learn's 1 / (alpha (t0 + t)) with t0 from Bottou's heuristic and "
                         "L2 weight decay alpha, t the step)"),
    "alpha": (float, f"--lr-schedule optimal: the L2 penalty, which also sets the rate (default "
                     f"{DEFAULT_ALPHA:g}, scikit-learn's)"),
    "warmup": (int, "linear warm-up steps (default 0)"),
    "lr_step_every": (int, "step schedule: decay every this many steps"),
    "lr_gamma": (float, "step schedule: decay factor (default 0.1)"),
    "momentum": (float, "momentum coefficient (default 0.9; adagrad takes none)"),
    "weight_decay": (float, "weight decay (default 0)"),
    "batch_size": (int, "batch size per worker (default 64)"),
    "epochs": (float, "epochs over each worker's slice (exclusive with --steps; default 1)"),
    "steps": (int, "steps (clocks) per worker (exclusive with --epochs; default 1 epoch)"),
    "seed": (int, "seed of initialisation and shuffling (default 0)"),
    "eval_every": (int, "evaluate on the test split every N steps (0: only at the end)"),
    "log_every": (int, "write a step record every N steps (default 20)"),
    "eval_samples": (int, "evaluate on the first N test samples (0: all)"),
    "checkpoint_dir": (str, "directory for HDF5 checkpoints"),
    "checkpoint_every": (int, "checkpoint every N steps (needs --checkpoint-dir)"),
    "checkpoint_keep": (int, "keep the run's newest N checkpoints in --checkpoint-dir "
                             "(default 3; 0: keep every one)"),
    "resume": (str, "resume from a checkpoint file, or the newest in a directory; auto: the "
                    "newest in --checkpoint-dir, else start fresh. The checkpoint's settings "
                    "are restored; a flag given here overrides one"),
    "log": (str, "JSON-lines metrics file (an existing one is appended to only on --resume)"),
    "overwrite": (bool, "replace an existing --log and another run's checkpoints in "
                        "--checkpoint-dir (refused without it)"),
    "quiet": (bool, "no progress bar"),
    "augment": (bool, "augment image batches on the workers: a random crop of each image padded "
                      "by H/8 pixels (4 for 32x32) and a horizontal flip half the time, seeded by "
                      "(seed, worker, step)"),
    "stall_timeout": (float, "report a rank waiting longer than this many seconds (default 60)"),
    "stall_abort": (float, "end the job when a rank waits longer than this (default 600)"),
    "skip_nonfinite": (bool, "skip and count pushes holding NaN/Inf instead of failing"),
}
#: every flag of `psgd train`: the core ones, then each feature's
FLAGS = {**CORE_FLAGS, **{name: spec for f in FEATURES for name, spec in f.FLAGS.items()}}

#: ``--help``'s sections: title -> the flags of one part of the core settings, then one per feature
GROUPS = {
    "data and model": ("data", "model", "augment"),
    "protocol": ("protocol", "servers", "staleness", "staleness_max", "overlap", "topology"),
    "optimizer and learning rate": ("optimizer", "lr", "lr_schedule", "alpha", "warmup",
                                    "lr_step_every", "lr_gamma", "momentum", "weight_decay"),
    "run length": ("batch_size", "epochs", "steps", "seed"),
    "evaluation and logs": ("eval_every", "eval_samples", "log_every", "log", "overwrite",
                            "quiet"),
    "checkpoints and resuming": ("checkpoint_dir", "checkpoint_every", "checkpoint_keep",
                                 "resume"),
    "failures and stalls": ("stall_timeout", "stall_abort", "skip_nonfinite"),
    **{f.TITLE: tuple(f.FLAGS) for f in FEATURES},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="TOML", help="TOML file of settings (flags override it)")
    for title, flags in GROUPS.items():
        group = parser.add_argument_group(title)
        for name in flags:
            _add_flag(group, name)


def _add_flag(group, name: str) -> None:
    kind, help_text, *metavar = FLAGS[name]   # (type, help) or (type, help, metavar)
    flag = "--" + name.replace("_", "-")
    if kind is bool:
        group.add_argument(flag, action="store_true", default=None, help=help_text)
    else:
        group.add_argument(flag, type=kind, default=None, help=help_text,
                           metavar=metavar[0] if metavar else name.upper())


def _coerce(name: str, value, source: str):
    kind = FLAGS[name][0]
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "0", "false", "no"):
            return value.lower() in ("1", "true", "yes")
        raise ValueError(f"{source}: {name} must be true or false, got {value!r}")
    if kind is float and isinstance(value, bool) or kind is int and isinstance(value, (bool, float)):
        raise ValueError(f"{source}: {name} must be {kind.__name__}, got {value!r}")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: {name} must be {kind.__name__}, got {value!r}") from None


def load_toml(path: str) -> dict:
    """Settings from a TOML file (top level or a [train] table); unknown keys are errors."""
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"config {path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"config {path}: not valid TOML ({exc})") from None
    table = raw.get("train", raw)
    if not isinstance(table, dict):
        raise ValueError(f"config {path}: [train] must be a table")
    out = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in FLAGS:
            raise ValueError(f"config {path}: unknown setting {key!r}")
        out[name] = _coerce(name, value, f"config {path}")
    if "data" in out and not os.path.isabs(out["data"]):
        # relative paths in a config file are relative to the working directory, like flags
        out["data"] = str(Path(out["data"]))
    return out


# Settings of a run that a resume does not take from its checkpoint: how this attempt runs
# (a checkpoint holds the serial flat vector, so any grid of model parts resumes it)
NOT_RESUMED = ("resume", "overwrite", "quiet", "stall_timeout", "stall_abort",
               *RecordOptions.FLAGS, *TraceOptions.FLAGS, *TensorOptions.FLAGS,
               *PipelineFlags.FLAGS, *ElasticOptions.FLAGS)
# Settings a protocol resolves for itself: restored only when the protocol stays the same
PER_PROTOCOL = ("servers", "staleness", "staleness_max", *CompensationOptions.FLAGS, "overlap",
                "topology")
RUN_LENGTH = ("steps", "epochs")


@dataclass
class Resumed:
    """The checkpoint a run resumes from, and what its command line changed."""

    path: Path
    step: int
    run_id: str
    changed: list[str]   # "lr 0.001 -> 0.01" for each setting given anew


def resolve(args: argparse.Namespace, environ=os.environ) -> RunPlan:
    """Merge flag > TOML config > PSGD_* variable > the resumed checkpoint's > default; validate."""
    return resolve_run(args, environ)[0]


def resolve_run(args: argparse.Namespace, environ=os.environ) -> tuple[RunPlan, Resumed | None]:
    """:func:`resolve`, and the checkpoint the run resumes from (None for a fresh start)."""
    given = given_settings(args, environ)
    resumed, stored = _from_checkpoint(given)
    plan = validate(RunPlan.from_flat({**_carried(stored, given), **given}))
    if resumed is not None:
        now = plan.as_dict()
        resumed.changed = [f"{name} {stored[name]} -> {now[name]}" for name in given
                           if name in stored and stored[name] != now[name]]
    return plan, resumed


def given_settings(args: argparse.Namespace, environ=os.environ) -> dict:
    """The settings given, flag name -> value: each from its flag, else the TOML config, else
    its PSGD_<NAME> variable (nothing filled in or checked)."""
    from_toml = load_toml(args.config) if getattr(args, "config", None) else {}
    given = {}
    for name in FLAG_NAMES:
        flag_value = getattr(args, name, None)
        env_value = environ.get("PSGD_" + name.upper())
        if flag_value is not None:
            given[name] = flag_value
        elif name in from_toml:
            given[name] = from_toml[name]
        elif env_value not in (None, ""):
            given[name] = _coerce(name, env_value, f"environment PSGD_{name.upper()}")
    _flag_wins_run_length(given, args)
    return given


def _from_checkpoint(given: dict) -> tuple[Resumed | None, dict]:
    """The checkpoint that ``given``'s --resume names, and the settings stored in it."""
    from psgd.run.checkpoint import read_header, resume_path
    path = resume_path(given.get("resume"), given.get("checkpoint_dir"))
    if path is None:
        return None, {}
    header = read_header(path)
    stored = {k: v for k, v in header["config"].items() if k in FLAGS and k not in NOT_RESUMED}
    return Resumed(path=path, step=header["step"], run_id=header["run_id"], changed=[]), stored


def _carried(stored: dict, given: dict) -> dict:
    """The stored settings a resumed run takes: those ``given`` neither sets nor invalidates."""
    if given.get("protocol", stored.get("protocol")) != stored.get("protocol"):
        stored = {k: v for k, v in stored.items() if k not in PER_PROTOCOL}
    if given.get("lr_schedule", stored.get("lr_schedule")) != "optimal":
        stored = {k: v for k, v in stored.items() if k != "alpha"}   # optimal's own setting
    if any(k in given for k in RUN_LENGTH):
        stored = {k: v for k, v in stored.items() if k not in RUN_LENGTH}
    return stored


def _flag_wins_run_length(values: dict, args: argparse.Namespace) -> None:
    """--steps on the command line replaces a config's or variable's epochs, and the reverse."""
    for given, other in (("steps", "epochs"), ("epochs", "steps")):
        if getattr(args, given, None) is not None and getattr(args, other, None) is None:
            values.pop(other, None)
