"""HDF5 checkpoints of a run, independent of its number of servers and workers: save, find, load."""
from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

import psgd
from psgd.atomic_file import atomic_output
from psgd.errors import UsageError

FORMAT_VERSION = 1
NAME_RE = re.compile(r"^ckpt-(\d{8})\.h5$")
AUTO = "auto"   # --resume auto: the newest checkpoint in --checkpoint-dir, else a fresh start
PARTS = "parts"  # a manifest's attribute: JSON list of its part files (psgd.run.checkpoint_parts)


@dataclass
class Checkpoint:
    """A checkpoint in memory."""

    params: np.ndarray
    model_spec: str
    step: int
    optimizer: str = "sgd"
    opt_state: dict = field(default_factory=dict)
    clocks: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    protocol: str = ""
    seed: int = 0
    config: dict = field(default_factory=dict)
    run_id: str = ""      # the run that wrote it ("" in checkpoints older than run ids)


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.h5"


def new_run_id() -> str:
    """A fresh run id: 12 hex digits."""
    return uuid.uuid4().hex[:12]


def save_checkpoint(directory: str | os.PathLike, ckpt: Checkpoint, keep: int = 3) -> Path:
    """Write ``ckpt`` atomically as ``directory/ckpt-<step>.h5``; keep its run's newest ``keep``.

    File layout (``format_version`` 1)::

        /params           float32 (n,)   the flat parameter vector
        /optimizer/<key>  float32 (n,)   per-element optimizer state (velocity, m, v)
        /clocks           int64 (W,)     each worker's clock at the snapshot (informational)
        attrs: format_version, psgd_version, model_spec, n_params, step, protocol,
               optimizer, optimizer_steps, seed, run_id, config (JSON of the run's settings)

    A crash leaves the previous checkpoint and a temp file ``.ckpt-*.h5.tmp``,
    which readers ignore and the next save into ``directory`` removes.

    Returns
    -------
    Path
        The file written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(ckpt.step)
    for stale in directory.glob(".ckpt-*.h5.tmp"):  # left by a writer killed mid-write
        stale.unlink(missing_ok=True)
    with atomic_output(final, prefix=".ckpt-", suffix=".h5.tmp") as tmp:
        _write_file(tmp, ckpt)
    prune(directory, ckpt.run_id, keep)
    return final


def prune(directory: Path, run_id: str, keep: int) -> None:
    """Remove all but run ``run_id``'s newest ``keep`` checkpoints (a manifest with its parts)."""
    for old in list_checkpoints(directory, run_id)[:-keep] if keep > 0 else []:
        parts = part_files(old)
        old.unlink(missing_ok=True)   # the manifest first: never a manifest without its parts
        for part in parts:
            part.unlink(missing_ok=True)


def _write_file(path: Path, ckpt: Checkpoint) -> None:
    with h5py.File(path, "w") as f:
        f.create_dataset("params", data=np.asarray(ckpt.params, dtype=np.float32))
        group = f.create_group("optimizer")
        for key, value in ckpt.opt_state.items():
            if np.ndim(value):
                group.create_dataset(key, data=np.asarray(value, dtype=np.float32))
        f.create_dataset("clocks", data=np.asarray(ckpt.clocks, dtype=np.int64))
        f.attrs.update(header(ckpt, int(np.size(ckpt.params))))


def header(ckpt: Checkpoint, n: int) -> dict:
    """The attributes of a checkpoint of ``n`` parameters (its optimizer's step count is the
    scalar in its optimizer state)."""
    steps = [int(v) for v in ckpt.opt_state.values() if np.ndim(v) == 0]
    return {"format_version": FORMAT_VERSION, "psgd_version": psgd.__version__,
            "model_spec": ckpt.model_spec, "n_params": n, "step": int(ckpt.step),
            "protocol": ckpt.protocol, "optimizer": ckpt.optimizer,
            "optimizer_steps": steps[-1] if steps else 0, "seed": int(ckpt.seed),
            "run_id": ckpt.run_id, "config": json.dumps(ckpt.config, sort_keys=True, default=str)}


def list_checkpoints(directory: str | os.PathLike, run_id: str | None = None) -> list[Path]:
    """Complete checkpoints in ``directory`` (of run ``run_id`` only, if given), oldest first;
    a manifest naming a missing part (a set cut off while written) is not one."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if NAME_RE.match(p.name) and not _missing_part(p)]
    if run_id is not None:
        found = [p for p in found if _run_id(p) == run_id]
    return sorted(found, key=lambda p: int(NAME_RE.match(p.name).group(1)))


def _run_id(path: Path) -> str | None:
    """The run id in a checkpoint's header ("" for one older than run ids; None if unreadable)."""
    try:
        with h5py.File(path, "r") as f:
            return str(f.attrs.get("run_id", ""))
    except OSError:
        return None


def part_files(path: Path) -> list[Path]:
    """The part files a manifest names ([] for a one-file checkpoint or an unreadable file)."""
    try:
        with h5py.File(path, "r") as f:
            names = json.loads(f.attrs.get(PARTS, "[]"))
    except (OSError, json.JSONDecodeError):
        return []
    return [path.parent / name for name in names]


def _missing_part(path: Path) -> str | None:
    return next((p.name for p in part_files(path) if not p.exists()), None)


def foreign_checkpoints(directory: str | os.PathLike, run_id: str) -> list[Path]:
    """The checkpoints in ``directory`` that another run wrote."""
    return [p for p in list_checkpoints(directory) if _run_id(p) != run_id]


def resume_path(resume: str | None, checkpoint_dir: str | None) -> Path | None:
    """The checkpoint ``--resume`` names: a file, the newest in a directory, or with ``auto``
    the newest in ``checkpoint_dir`` (None when there is none yet, or no --resume)."""
    if not resume:
        return None
    if resume == AUTO:
        if not checkpoint_dir:
            raise UsageError("--resume auto needs --checkpoint-dir")
        found = list_checkpoints(checkpoint_dir)
        return found[-1] if found else None
    path = Path(resume)
    if path.is_dir():
        found = list_checkpoints(path)
        if not found:
            raise UsageError(f"--resume {path}: no checkpoint (ckpt-*.h5) in that directory")
        return found[-1]
    if not path.exists():
        raise UsageError(f"--resume {path}: no such file or directory")
    return path


def read_header(path: str | os.PathLike) -> dict:
    """A checkpoint's step, run id and settings, without reading its arrays."""
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise UsageError(f"checkpoint {path}: not a readable HDF5 file ({exc})") from None
    with f:
        attrs = dict(f.attrs)
    if "step" not in attrs or "model_spec" not in attrs:
        raise UsageError(f"checkpoint {path}: missing attribute 'step' (not a psgd checkpoint?)")
    return {"step": int(attrs["step"]), "run_id": str(attrs.get("run_id", "")),
            "config": _config(path, attrs)}


def _config(path, attrs: dict) -> dict:
    try:
        config = json.loads(attrs.get("config", "{}"))
    except json.JSONDecodeError:
        raise UsageError(f"checkpoint {path}: attribute 'config' is not valid JSON") from None
    if not isinstance(config, dict):
        raise UsageError(f"checkpoint {path}: attribute 'config' is not a JSON object")
    return config


def _steps(attrs: dict, part: tuple[int, int] | None) -> int:
    """The optimizer's step count: a manifest's for the part that holds ``part``'s start (its
    parts' optimizers may have stepped apart), else the checkpoint's."""
    bounds = json.loads(attrs.get("part_steps", "[]"))   # [[lo, hi, steps], ...]
    at = part[0] if part is not None else 0
    return next((s for lo, hi, s in bounds if lo <= at < hi),
                int(attrs.get("optimizer_steps", 0)))


def load_checkpoint(path: str | os.PathLike, part: tuple[int, int] | None = None,
                    take=None) -> Checkpoint:
    """Read and validate a checkpoint file; a clear ValueError names what is wrong.

    ``part=(lo, hi)`` reads only that slice of the parameter and optimizer vectors (a
    pipeline stage's); ``take(read, n)`` reads a part made of many slices of a vector of ``n``
    values (a tensor part's), each by ``read(lo, hi)``, and returns it.  The shapes are
    checked against the whole vector's all the same.
    """
    cut = slice(None) if part is None else slice(*part)

    def read(ds) -> np.ndarray:
        if take is None:
            return np.asarray(ds[cut], dtype=np.float32)
        return take(lambda lo, hi: np.asarray(ds[lo:hi], dtype=np.float32), ds.shape[0])

    path = Path(path)
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise UsageError(f"checkpoint {path}: not a readable HDF5 file ({exc})") from None
    with f:
        attrs = dict(f.attrs)
        for key in ("format_version", "model_spec", "step", "n_params"):
            if key not in attrs:
                raise UsageError(f"checkpoint {path}: missing attribute {key!r} (not a psgd checkpoint?)")
        if int(attrs["format_version"]) != FORMAT_VERSION:
            raise UsageError(f"checkpoint {path}: format version {attrs['format_version']} "
                             f"is not supported (this psgd reads {FORMAT_VERSION})")
        if "params" not in f:
            raise UsageError(f"checkpoint {path}: missing dataset /params")
        missing = _missing_part(path)
        if missing:
            raise UsageError(f"checkpoint {path}: its part {missing} is missing (a set whose "
                             f"writing was cut off)")
        n = int(attrs["n_params"])
        if f["params"].shape != (n,):
            raise UsageError(f"checkpoint {path}: /params has shape {f['params'].shape}, "
                             f"attribute n_params says {n}")
        params = read(f["params"])
        if not np.isfinite(params).all():
            raise UsageError(f"checkpoint {path}: /params holds non-finite values")
        opt_state: dict = {}
        for key, ds in f.get("optimizer", {}).items():
            if ds.shape != (n,):
                raise UsageError(f"checkpoint {path}: /optimizer/{key} has shape {ds.shape}, "
                                 f"expected ({n},)")
            opt_state[key] = read(ds)
        opt_state["steps"] = _steps(attrs, part)
        clocks = np.asarray(f["clocks"][...], dtype=np.int64) if "clocks" in f else np.zeros(0, np.int64)
        config = _config(path, attrs)
    return Checkpoint(params=params, model_spec=str(attrs["model_spec"]), step=int(attrs["step"]),
                      optimizer=str(attrs.get("optimizer", "sgd")), opt_state=opt_state,
                      clocks=clocks, protocol=str(attrs.get("protocol", "")),
                      seed=int(attrs.get("seed", 0)), config=config,
                      run_id=str(attrs.get("run_id", "")))
