"""`psgd data convert INPUT`: tell what INPUT is (npz, IDX folder, CIFAR-10 folder, image tree) and convert it."""
from __future__ import annotations

import os
import re
from pathlib import Path

from psgd.data import cifar, idx, images, npz

#: the four IDX roles and the file names that fill them (MNIST, Fashion-MNIST, EMNIST style)
IDX_ROLES = {
    "train images": r"train-images(-idx3-ubyte|\.idx3-ubyte)?(\.gz)?",
    "train labels": r"train-labels(-idx1-ubyte|\.idx1-ubyte)?(\.gz)?",
    "test images": r"(t10k|test)-images(-idx3-ubyte|\.idx3-ubyte)?(\.gz)?",
    "test labels": r"(t10k|test)-labels(-idx1-ubyte|\.idx1-ubyte)?(\.gz)?",
}
KINDS = ("npz", "idx", "cifar10", "images")


def find_idx(folder: Path) -> dict[str, Path] | None:
    """The four IDX files of ``folder`` by role; None when it has none; ValueError when some lack."""
    names = sorted(p for p in folder.iterdir() if p.is_file())
    found = {}
    for role, pattern in IDX_ROLES.items():
        hits = [p for p in names if re.fullmatch(pattern, p.name)]
        if len(hits) > 1:
            raise ValueError(f"{folder}: more than one IDX file for the {role}: "
                             f"{', '.join(p.name for p in hits)}")
        if hits:
            found[role] = hits[0]
    if not found:
        return None
    missing = [r for r in IDX_ROLES if r not in found]
    if missing:
        raise ValueError(f"{folder}: has IDX files but none for the {', '.join(missing)} "
                         f"(expected names like train-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz)")
    return found


def detect(path: str | os.PathLike) -> str:
    """What ``path`` holds: one of :data:`KINDS`, or a ValueError saying what was looked for."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"{p}: no such file or directory")
    if p.is_file():
        if p.suffix.lower() == ".npz":
            return "npz"
        raise ValueError(f"{p}: a file that is not an .npz; convert takes an .npz or a folder "
                         f"(IDX files, CIFAR-10 batches, or train/<class>/ and test/<class>/ images)")
    if cifar.cifar_kind(p):
        return "cifar10"
    if images.is_image_tree(p):
        return "images"
    if find_idx(p):
        return "idx"
    raise ValueError(f"{p}: found no IDX files (train-images..., t10k-labels...), no CIFAR-10 "
                     f"batches (data_batch_1, test_batch) and no train/ and test/ image folders")


def convert_input(path: str | os.PathLike, out: str | os.PathLike, n_classes: int | None = None,
                  *, nhwc: bool = False, size: tuple | None = None, keep_order: bool = False,
                  shuffle_seed: int = 0) -> tuple[str, Path]:
    """Detect the kind of ``path`` and convert it to ``out``; returns (kind, written file).

    Rows are stored shuffled by ``shuffle_seed`` unless ``keep_order``.
    """
    kind = detect(path)
    p = Path(path)
    order = {"keep_order": keep_order, "shuffle_seed": shuffle_seed}
    if kind == "npz":
        return kind, npz.convert_npz(p, out, n_classes, nhwc=nhwc, **order)
    if kind == "idx":
        f = find_idx(p)
        return kind, idx.convert_idx(f["train images"], f["train labels"], f["test images"],
                                     f["test labels"], out, n_classes, **order)
    if kind == "cifar10":
        return kind, cifar.convert_cifar(p, out, **order)
    return kind, images.convert_image_tree(p, out, size=size, **order)
