"""The peer benchmark's data: Fashion-MNIST (IDX) and a tinted 3x32x32 colour version of it, as psgd HDF5 files."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from psgd.data.idx import convert_idx, read_idx_images, read_idx_labels
from psgd.data.layout import write_dataset

FMNIST = Path("/usr/share/datasets/fashion-mnist")
FILES = {"train-images": "train-images-idx3", "train-labels": "train-labels-idx1",
         "test-images": "t10k-images-idx3", "test-labels": "t10k-labels-idx1"}


def _idx(kind: str) -> Path:
    found = sorted(FMNIST.glob(f"{FILES[kind]}*"))
    if not found:
        raise SystemExit(f"bench-peer: {FMNIST} has no {FILES[kind]} file (apt-get install "
                         f"dataset-fashion-mnist)")
    return found[0]


def _subset(x, y, n: int, seed: int):
    """``n`` rows drawn at random (all when n is 0 or too large), in a shuffled order."""
    rows = np.random.default_rng(seed).permutation(len(y))[:n or len(y)]
    return x[rows], y[rows]


def fashion(out: Path, n_train: int, n_test: int) -> Path:
    """Fashion-MNIST as (N, 1, 28, 28) uint8; a random subset of rows when n_train/n_test > 0."""
    if not n_train and not n_test:
        return convert_idx(_idx("train-images"), _idx("train-labels"), _idx("test-images"),
                           _idx("test-labels"), out)
    xtr, ytr = _subset(read_idx_images(_idx("train-images")), read_idx_labels(_idx("train-labels")), n_train, 1)
    xte, yte = _subset(read_idx_images(_idx("test-images")), read_idx_labels(_idx("test-labels")), n_test, 2)
    return write_dataset(out, xtr, ytr, xte, yte, n_classes=10, source="fashion-mnist subset")


def _tint(x: np.ndarray, seed: int) -> np.ndarray:
    """(N, 28, 28) grey -> (N, 3, 32, 32): each garment in a random colour on a random dark background."""
    rng = np.random.default_rng(seed)
    n = len(x)
    grey = np.zeros((n, 32, 32), np.float32)
    grey[:, 2:30, 2:30] = x.reshape(n, 28, 28) / 255.0
    fg = rng.uniform(0.35, 1.0, (n, 3, 1, 1)).astype(np.float32)
    bg = rng.uniform(0.0, 0.45, (n, 3, 1, 1)).astype(np.float32)
    img = grey[:, None] * fg + (1.0 - grey[:, None]) * bg
    img += rng.normal(0.0, 0.03, img.shape).astype(np.float32)   # sensor noise
    return np.clip(np.round(img * 255.0), 0, 255).astype(np.uint8)


def colour(out: Path, n_train: int, n_test: int) -> Path:
    """Tinted Fashion-MNIST, (N, 3, 32, 32) uint8 with per-channel normalisation stored."""
    xtr, ytr = _subset(read_idx_images(_idx("train-images")), read_idx_labels(_idx("train-labels")), n_train, 3)
    xte, yte = _subset(read_idx_images(_idx("test-images")), read_idx_labels(_idx("test-labels")), n_test, 4)
    return write_dataset(out, _tint(xtr, 5), ytr, _tint(xte, 6), yte, n_classes=10,
                         source="tinted fashion-mnist 3x32x32", normalize=True)
