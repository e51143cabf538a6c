"""The settings of `psgd train`: flags, TOML config and PSGD_* variables resolved into one validated object."""
from __future__ import annotations

import argparse
import math
import os
import textwrap
import tomllib
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from psgd import compress
from psgd.hogwild import DEFAULT_HOLD
from psgd.nn.optim import DEFAULT_ALPHA, OPTIMIZERS, SCHEDULES
from psgd.run.flag_groups import GROUPS
from psgd.run.optimizer_defaults import (DENSE_DEFAULT, SPARSE_DEFAULT, check_optimizer,
                                         default_text, fill_defaults)
from psgd.protocols import AUTO, DEFAULT_STALENESS_MAX, PROTOCOLS, get, names
from psgd.protocols.momentum import mode as momentum_mode
from psgd.ps import compensation
from psgd.run import straggler, tensor_flags

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


@dataclass
class TrainSettings:
    """Every setting of a training run (one field per flag)."""

    data: str | None = None
    model: str = "lenet"
    protocol: str = "ssp"
    servers: int | None = None        # default: 1, or 0 for a protocol without servers
    staleness: int | str | None = None  # the bound, for protocols that take one (ssp: default 2),
                                        # or auto (psgd.ps.adaptive)
    staleness_max: int | None = None  # --staleness auto's largest bound (default 16)
    staleness_comp: str | None = None  # default: auto where updates are stale, else none
    comp_lambda: float | None = None
    staleness_lr: str = "none"         # the older spelling of --staleness-comp inverse
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
    resume: str | None = None
    log: str | None = None
    overwrite: bool = False
    quiet: bool = False
    stall_timeout: float = 60.0
    stall_abort: float = 600.0
    skip_nonfinite: bool = False
    record: str | None = None
    replay: str | None = None
    timeline: str | None = None
    tensorboard: str | None = None
    compress: str = "none"
    compress_bucket: int = 512
    error_feedback: str = "auto"
    momentum_correction: str = "auto"
    augment: bool = False
    straggler: str | None = None      # straggler emulation spec (psgd.run.straggler)
    hold_hot: int | None = None       # sparse hogwild: steps a worker holds its hot rows' changes
    tensor: int | None = None         # model parallelism inside layers (psgd.run.tensor_rank)
    spatial: int | None = None
    grid: str | None = None
    dtype: str = "float32"

    def as_dict(self) -> dict:
        return asdict(self)


#: each setting's environment variable, PSGD_<NAME> (psgd.env.KNOBS are the others)
FLAG_VARIABLES = frozenset(f"PSGD_{f.name.upper()}" for f in fields(TrainSettings))


# flag name -> (type, help); bools are store_true flags
FLAGS: dict[str, tuple[type, str]] = {
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
    "staleness_comp": (str, "staleness compensation on the servers: " + "; ".join(
        f"{name} ({text})" for name, text in compensation.help_items().items())
        + f" (default auto for {names(compensations=None)} and hogwild, "
          f"none where steps are never stale)"),
    "comp_lambda": (float, f"dcasgd's lambda_0 >= 0 (default {compensation.DEFAULT_LAMBDA:g})"),
    "staleness_lr": (str, "none, or inverse: the older spelling of --staleness-comp inverse"),
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
    "record": (str, f"write the servers' order of pushes and pulls to this HDF5 file "
                    f"({names(able='replay')}; see --replay)"),
    "replay": (str, "run again exactly as recorded: the same command with --replay FILE "
                    "(and its own --log) gives bit-identical parameters and losses"),
    "timeline": (str, "write every rank's compute, push, wait, pull, all-reduce and server "
                      "spans to this Chrome trace JSON file (Perfetto, chrome://tracing)"),
    "tensorboard": (str, "also write the metrics as TensorBoard event files into this directory "
                         "(tensorboardX: pip install 'psgd[tensorboard]')"),
    "compress": (str, "compress every push (" + names(able="compress") + "): " + "; ".join(
        f"{k} ({v})" for k, v in compress.HELP.items()) + " (default none)"),
    "compress_bucket": (int, "elements per bucket of qsgd's norms and sign's scales (default "
                             "512)"),
    "error_feedback": (str, "auto, on or off: keep what compression dropped and add it to the "
                            "next push (auto: on for topk and sign)"),
    "momentum_correction": (str, "auto, on, off or gain: on: each worker keeps the momentum "
                                 "of its own gradients and pushes that velocity; the servers "
                                 "(or the average) then take a plain step (Deep Gradient "
                                 "Compression's momentum correction; under ssp and asp the "
                                 "velocity takes the momentum --staleness-comp amom sets; "
                                 + names(able="momentum-correction") + " with "
                                 "--optimizer momentum or nesterov); gain ("
                                 + names(able="momentum-gain") + "): the servers step plain SGD "
                                 "at lr / (1 - momentum) on the pushed gradients; auto: where "
                                 "error feedback runs, gain under " + names(able="momentum-gain")
                                 + " with sign, else on"),
    "straggler": (str, "emulate stragglers: " + straggler.FORMAT + "; slow=f: the worker's "
                       "compute takes f times as long (it sleeps (f - 1) x its compute after "
                       "each step), p=q,d=t: each step pauses t seconds (d=5x: 5 x its mean "
                       "compute time) with probability q, seeded by --seed; e.g. "
                       "'1:slow=3' or 'all:p=0.1,d=5x'"),
    "hold_hot": (int, "hogwild on sparse data: each worker adds its changes to the rows most of "
                      "its batches touch (the bias, the most frequent features) every N steps "
                      "instead of every step, and reads them back then: fewer writes to the cache "
                      "lines all workers share, those rows up to N steps stale (1: every step; "
                      f"default {DEFAULT_HOLD}; applies where the steps run fused: --optimizer sgd "
                      "or adagrad on one node, see docs/design/hogwild.md)"),
    **tensor_flags.FLAGS,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="TOML", help="TOML file of settings (flags override it)")
    group_of = {name: title for title, names in GROUPS.items() for name in names}
    groups = {title: parser.add_argument_group(title) for title in [*GROUPS, "other"]}
    for name, (kind, help_text) in FLAGS.items():
        flag, group = "--" + name.replace("_", "-"), groups[group_of.get(name, "other")]
        if kind is bool:
            group.add_argument(flag, action="store_true", default=None, help=help_text)
        else:
            group.add_argument(flag, type=kind, default=None, help=help_text,
                               metavar=name.upper())


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
NOT_RESUMED = ("resume", "overwrite", "quiet", "stall_timeout", "stall_abort", "record",
               "replay", "timeline", "tensorboard", *tensor_flags.FLAGS)
# Settings a protocol resolves for itself: restored only when the protocol stays the same
PER_PROTOCOL = ("servers", "staleness", "staleness_max", "staleness_comp", "comp_lambda",
                "staleness_lr", "overlap", "topology")
RUN_LENGTH = ("steps", "epochs")


@dataclass
class Resumed:
    """The checkpoint a run resumes from, and what its command line changed."""

    path: Path
    step: int
    run_id: str
    changed: list[str]   # "lr 0.001 -> 0.01" for each setting given anew


def resolve(args: argparse.Namespace, environ=os.environ) -> TrainSettings:
    """Merge flag > TOML config > PSGD_* variable > the resumed checkpoint's > default; validate."""
    return resolve_run(args, environ)[0]


def resolve_run(args: argparse.Namespace, environ=os.environ) -> tuple[TrainSettings, Resumed | None]:
    """:func:`resolve`, and the checkpoint the run resumes from (None for a fresh start)."""
    from_toml = load_toml(args.config) if getattr(args, "config", None) else {}
    given = {}
    for f in fields(TrainSettings):
        flag_value = getattr(args, f.name, None)
        env_value = environ.get("PSGD_" + f.name.upper())
        if flag_value is not None:
            given[f.name] = flag_value
        elif f.name in from_toml:
            given[f.name] = from_toml[f.name]
        elif env_value not in (None, ""):
            given[f.name] = _coerce(f.name, env_value, f"environment PSGD_{f.name.upper()}")
    _flag_wins_run_length(given, args)
    resumed, stored = _from_checkpoint(given)
    settings = validate(TrainSettings(**{**_carried(stored, given), **given}))
    if resumed is not None:
        resumed.changed = [f"{name} {stored[name]} -> {getattr(settings, name)}" for name in given
                           if name in stored and stored[name] != getattr(settings, name)]
    return settings, resumed


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


def validate(given: TrainSettings) -> TrainSettings:
    """The settings with their defaults filled in (``given`` is left as it was); ValueError
    naming the first bad setting."""
    s = replace(given)
    if s.data is None:
        raise ValueError("no dataset: pass --data FILE (make one with `python -m psgd data synth -o FILE`)")
    if not os.path.exists(s.data):
        raise ValueError(f"--data {s.data}: no such file")
    protocol = get(s.protocol)
    if s.servers is None:
        s.servers = 1 if protocol.servers else 0
    if s.record and s.replay:
        raise ValueError("give --record or --replay, not both")
    if s.tensorboard:
        from psgd.run.tb_events import check_dir
        check_dir(s.tensorboard)
    fill_defaults(s)
    bound = protocol.check(staleness=s.staleness, overlap=s.overlap, optimizer=s.optimizer,
                           n_servers=s.servers, staleness_max=s.staleness_max,
                           replay="--record" if s.record else "--replay" if s.replay else None,
                           compress=s.compress, topology=s.topology,
                           error_feedback=s.error_feedback,
                           momentum_correction=s.momentum_correction)
    compress.check(s.compress, s.compress_bucket, s.error_feedback)
    if s.hold_hot is not None and (s.hold_hot < 1 or not protocol.can("hot-rows")):
        raise ValueError(f"--hold-hot must be >= 1, got {s.hold_hot}" if s.hold_hot < 1 else
                         f"--hold-hot applies to --protocol {names(able='hot-rows')} on sparse "
                         f"data, not {s.protocol}")
    _staleness_comp(s, protocol)
    momentum_mode(protocol, s.momentum_correction, optimizer=s.optimizer, feedback=False,
                  staleness_comp=s.staleness_comp)
    if s.staleness == AUTO:
        s.staleness_max = int(bound)
    elif protocol.bound is None:
        s.staleness = int(bound)
    check_optimizer(s, protocol.can("hot-rows"))
    _check_numbers(s)
    tensor_flags.check(s)
    straggler.parse(s.straggler)   # the worker indices are checked against the job's workers
    if s.replay and not os.path.exists(s.replay):
        raise ValueError(f"--replay {s.replay}: no such file")
    if s.log and os.path.exists(s.log) and not (s.resume or s.overwrite):
        raise ValueError(f"--log {s.log} exists (another run's log): continue that run with "
                         f"--resume, replace the log with --overwrite, or give another --log")
    return s


def _check_numbers(s: TrainSettings) -> None:
    """Raise ValueError naming the first numeric setting out of its range."""
    if s.lr is not None and not (math.isfinite(s.lr) and s.lr > 0):
        raise ValueError(f"--lr must be a positive number, got {s.lr}")
    if not 0 <= s.momentum < 1:
        raise ValueError(f"--momentum must be in [0, 1), got {s.momentum}")
    if s.weight_decay < 0:
        raise ValueError(f"--weight-decay must be >= 0, got {s.weight_decay}")
    if s.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {s.batch_size}")
    if s.epochs is not None and s.steps is not None:
        raise ValueError("give --epochs or --steps, not both")
    if s.epochs is not None and not s.epochs > 0:
        raise ValueError(f"--epochs must be > 0, got {s.epochs}")
    if s.steps is not None and s.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {s.steps}")
    for name in ("eval_every", "log_every", "checkpoint_every", "warmup", "eval_samples"):
        if getattr(s, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(s, name)}")
    if s.log_every == 0:
        s.log_every = 1
    if s.checkpoint_every and not s.checkpoint_dir:
        raise ValueError("--checkpoint-every needs --checkpoint-dir")
    if s.stall_timeout <= 0 or s.stall_abort <= 0:
        raise ValueError("--stall-timeout and --stall-abort must be > 0")


def _staleness_comp(s: TrainSettings, protocol) -> None:
    """Resolve --staleness-comp (and its older spelling --staleness-lr) against the protocol."""
    if s.staleness_lr not in ("none", "inverse"):
        raise ValueError(f"--staleness-lr {s.staleness_lr!r} is not none or inverse")
    if s.staleness_lr == "inverse":
        if s.staleness_comp not in (None, "inverse"):
            raise ValueError(f"--staleness-lr inverse and --staleness-comp {s.staleness_comp} "
                             f"disagree: give --staleness-comp only")
        s.staleness_comp = "inverse"
    protocol.compensation(s.staleness_comp, s.optimizer, s.comp_lambda)
    if s.staleness_comp is None:
        s.staleness_comp = protocol.default_compensation()
