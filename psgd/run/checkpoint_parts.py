"""Checkpoints written in parts: each holder of a slice of the flat vector (a pipeline stage)
writes its own part file, then one rank writes the manifest ``ckpt-<step>.h5``, a checkpoint
of the usual format whose /params and /optimizer/<key> are HDF5 virtual datasets over the
parts, so every reader of one-file checkpoints reads it unchanged.  The manifest is written
last and atomically: a set without one, or whose manifest names a missing part, is none."""
from __future__ import annotations

import json
import re
from pathlib import Path

import h5py
import numpy as np

from psgd.atomic_file import atomic_output
from psgd.run.checkpoint import PARTS, Checkpoint, checkpoint_name, header, prune

PART_RE = re.compile(r"^ckpt-(\d{8})\.part-\d{3}\.h5$")


def part_name(step: int, index: int) -> str:
    return f"ckpt-{step:08d}.part-{index:03d}.h5"


def save_part(directory: str | Path, step: int, index: int, params: np.ndarray,
              opt_state: dict) -> Path:
    """Write part ``index`` of step ``step``'s set atomically: ``params`` and the optimizer
    state's arrays (float32, one slice of the flat vectors)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / part_name(step, index)
    with atomic_output(path, prefix=".part-", suffix=".h5.tmp") as tmp:
        with h5py.File(tmp, "w") as f:
            f.create_dataset("params", data=np.asarray(params, dtype=np.float32))
            for key, value in opt_state.items():
                if np.ndim(value):
                    f.create_dataset(f"optimizer/{key}", data=np.asarray(value, dtype=np.float32))
    return path


def save_manifest(directory: str | Path, ckpt: Checkpoint, parts: list, keys: list,
                  keep: int = 3) -> Path:
    """Write ``ckpt``'s manifest over the parts already on disk, then keep the run's newest
    ``keep`` sets and drop parts no manifest names (a set cut off while written).

    ``parts`` holds each part's (lo, hi, optimizer steps), in order, covering the vector;
    ``keys`` names the optimizer's per-element arrays (each part holds them all);
    ``ckpt.params`` is not read (the parts hold the values).
    """
    directory, n = Path(directory), int(parts[-1][1])
    names = [part_name(ckpt.step, i) for i in range(len(parts))]
    final = directory / checkpoint_name(ckpt.step)
    for stale in [*directory.glob(".part-*.h5.tmp"), *directory.glob(".ckpt-*.h5.tmp")]:
        stale.unlink(missing_ok=True)   # every part of this set is in: no writer is running
    with atomic_output(final, prefix=".ckpt-", suffix=".h5.tmp") as tmp:
        with h5py.File(tmp, "w") as f:
            f.create_group("optimizer")
            for key in ["params", *(f"optimizer/{k}" for k in keys)]:
                layout = h5py.VirtualLayout(shape=(n,), dtype=np.float32)
                for name, (lo, hi, _) in zip(names, parts):
                    layout[lo:hi] = h5py.VirtualSource(name, key, shape=(hi - lo,))
                f.create_virtual_dataset(key, layout, fillvalue=np.nan)
            f.create_dataset("clocks", data=np.asarray(ckpt.clocks, dtype=np.int64))
            f.attrs.update(header(ckpt, n))
            f.attrs.update({PARTS: json.dumps(names),
                            "part_steps": json.dumps([[int(v) for v in p] for p in parts])})
    prune(directory, ckpt.run_id, keep)
    _drop_orphans(directory)
    return final


def _drop_orphans(directory: Path) -> None:
    """Remove the parts of sets that have no manifest."""
    for path in directory.iterdir():
        match = PART_RE.match(path.name)
        if match and not (directory / checkpoint_name(int(match.group(1)))).exists():
            path.unlink(missing_ok=True)
