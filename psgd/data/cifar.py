"""CIFAR-10 batch folders (the python pickles or the binary records) into the psgd HDF5 layout."""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from psgd.data import layout

TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST = "test_batch"
RECORD = 1 + 3 * 32 * 32     # binary: one label byte, then 1024 red, 1024 green, 1024 blue


def cifar_kind(folder: Path) -> str | None:
    """``"python"`` or ``"binary"`` when ``folder`` holds CIFAR-10 batches, else None."""
    if (folder / TEST).is_file() and (folder / TRAIN[0]).is_file():
        return "python"
    if (folder / f"{TEST}.bin").is_file() and (folder / f"{TRAIN[0]}.bin").is_file():
        return "binary"
    return None


def _read_python(path: Path) -> tuple[np.ndarray, np.ndarray]:
    # the python version is pickled by its authors; only open files you trust
    try:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="bytes")
        data, labels = np.asarray(d[b"data"], np.uint8), np.asarray(d[b"labels"])
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: not a CIFAR-10 python batch ({type(exc).__name__}: {exc})") from None
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(labels) != len(data):
        raise ValueError(f"{path}: expected data (N, 3072) and N labels, got {data.shape} "
                         f"and {len(labels)}")
    return data.reshape(-1, 3, 32, 32), labels


def _read_binary(path: Path) -> tuple[np.ndarray, np.ndarray]:
    raw = np.fromfile(path, np.uint8)
    if raw.size == 0 or raw.size % RECORD:
        raise ValueError(f"{path}: {raw.size} bytes is not a whole number of {RECORD}-byte "
                         f"CIFAR-10 records")
    rec = raw.reshape(-1, RECORD)
    return rec[:, 1:].reshape(-1, 3, 32, 32), rec[:, 0]


def convert_cifar(folder: str | os.PathLike, out: str | os.PathLike, keep_order: bool = False, shuffle_seed: int = 0) -> Path:
    """Convert a CIFAR-10 folder (``data_batch_1..5`` and ``test_batch``, ``.bin`` or not).

    Images are stored as (N, 3, 32, 32) uint8 NCHW with scale 1/255 and the train split's
    per-channel mean and std (which the reader normalises by); the train batches present
    are concatenated in order (at least ``data_batch_1``), then stored shuffled unless
    ``keep_order`` (see :func:`psgd.data.layout.write_dataset`).
    """
    folder = Path(folder)
    kind = cifar_kind(folder)
    if kind is None:
        raise ValueError(f"{folder}: no CIFAR-10 batches ({TRAIN[0]} and {TEST}, or their .bin)")
    read, suffix = (_read_python, "") if kind == "python" else (_read_binary, ".bin")
    parts = [read(folder / f"{name}{suffix}") for name in TRAIN if (folder / f"{name}{suffix}").is_file()]
    x_test, y_test = read(folder / f"{TEST}{suffix}")
    layout.check_output_path(out)
    return layout.write_dataset(out, np.concatenate([p[0] for p in parts]),
                                np.concatenate([p[1] for p in parts]), x_test, y_test,
                                n_classes=10, scale=layout.UINT8_SCALE, offset=0.0,
                                source=f"cifar10-{kind}:{folder.name}", normalize=True,
                                keep_order=keep_order, shuffle_seed=shuffle_seed)
