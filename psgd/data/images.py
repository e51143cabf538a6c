"""Image-folder trees (``train/<class>/*.png``, ``test/<class>/...``) into the psgd HDF5 layout, via Pillow."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from psgd.data import layout

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
GRAY_MODES = ("1", "L", "LA", "I", "I;16", "F")


def is_image_tree(folder: Path) -> bool:
    return (folder / "train").is_dir() and (folder / "test").is_dir()


def _pillow():
    try:
        from PIL import Image
    except ImportError:
        raise ValueError("reading image folders needs Pillow: pip install 'psgd[images]' "
                         "(or pip install Pillow)") from None
    return Image


def _class_files(split_dir: Path) -> dict[str, list[Path]]:
    classes = sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not classes:
        raise ValueError(f"{split_dir}: no class folders (expected {split_dir}/<class>/*.png or .jpg)")
    files = {}
    for c in classes:
        found = sorted(p for p in c.iterdir() if p.is_file() and p.suffix.lower() in SUFFIXES)
        if not found:
            raise ValueError(f"{c}: class folder holds no images ({', '.join(SUFFIXES)})")
        files[c.name] = found
    return files


def _load(Image, path: Path, rgb: bool, size: tuple | None):
    try:
        with Image.open(path) as im:
            im = im.convert("RGB" if rgb else "L")
            if size is not None and im.size != (size[1], size[0]):
                im = im.resize((size[1], size[0]), Image.BILINEAR)
            a = np.asarray(im, np.uint8)
    except (OSError, ValueError) as exc:   # PIL.UnidentifiedImageError is an OSError
        raise ValueError(f"{path}: cannot read as an image ({exc})") from None
    return a.transpose(2, 0, 1) if rgb else a[None]


def _is_gray(Image, path: Path) -> bool:
    try:
        with Image.open(path) as im:
            return im.mode in GRAY_MODES
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read as an image ({exc})") from None


def convert_image_tree(folder: str | os.PathLike, out: str | os.PathLike,
                       size: tuple | None = None, keep_order: bool = False, shuffle_seed: int = 0) -> Path:
    """Convert ``folder/train/<class>/*`` and ``folder/test/<class>/*`` into a psgd HDF5 dataset.

    Class ids follow the sorted names of ``train``'s class folders (``test`` may lack some
    but not add any).  Images become uint8 NCHW with scale 1/255: 1 channel when every
    image is greyscale, else RGB (3) with the train split's per-channel mean and std.  All must share one size unless ``size`` (H, W)
    is given, which resizes them.  The files are read class by class, so the rows are
    stored shuffled unless ``keep_order`` (see :func:`psgd.data.layout.write_dataset`).
    """
    Image = _pillow()
    folder = Path(folder)
    layout.check_output_path(out)
    splits = {s: _class_files(folder / s) for s in layout.SPLITS}
    names = list(splits["train"])
    extra = sorted(set(splits["test"]) - set(names))
    if extra:
        raise ValueError(f"{folder / 'test'}: class folder(s) {', '.join(extra)} are not in "
                         f"{folder / 'train'}")
    every = [p for s in splits.values() for fs in s.values() for p in fs]
    rgb = not all(_is_gray(Image, p) for p in every)
    arrays, first = {}, None
    for split, classes in splits.items():
        xs, ys = [], []
        for name, files in classes.items():
            for p in files:
                a = _load(Image, p, rgb, size)
                first = first or (p, a.shape)
                if a.shape != first[1]:
                    raise ValueError(f"{p}: {a.shape[1]}x{a.shape[2]} pixels, but {first[0]} has "
                                     f"{first[1][1]}x{first[1][2]}; give --size HxW to resize")
                xs.append(a)
                ys.append(names.index(name))
        arrays[split] = (np.stack(xs), np.asarray(ys, np.int32))
    return layout.write_dataset(out, *arrays["train"], *arrays["test"], n_classes=len(names),
                                scale=layout.UINT8_SCALE, offset=0.0,
                                source=f"images:{folder.name}:" + ",".join(names), normalize=rgb,
                                keep_order=keep_order, shuffle_seed=shuffle_seed)
