"""NumPy .npz archives (x_train, y_train, x_test, y_test) into the psgd HDF5 layout."""
from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import numpy as np

from psgd.data import layout

KEYS = ("x_train", "y_train", "x_test", "y_test")


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Load the four arrays of a dataset .npz.

    Returns
    -------
    dict
        ``x_train`` (N, ...) , ``y_train`` (N,), ``x_test`` (M, ...), ``y_test`` (M,),
        dtypes as stored.

    Raises
    ------
    ValueError
        Missing file, not an npz archive, a missing key, or pickled object arrays.
    """
    p = layout.check_input_file(path, "npz file")
    try:
        with np.load(p, allow_pickle=False) as archive:
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise ValueError(f"{p}: is a single .npy array, expected an .npz archive with keys "
                                 f"{', '.join(KEYS)}")
            missing = [k for k in KEYS if k not in archive.files]
            if missing:
                raise ValueError(f"{p}: missing array(s) {', '.join(missing)} (has: "
                                 f"{', '.join(archive.files) or 'none'})")
            return {k: archive[k] for k in KEYS}
    except ValueError as exc:
        if str(exc).startswith(str(p)):
            raise
        raise ValueError(f"{p}: cannot read npz ({exc})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as exc:
        raise ValueError(f"{p}: not a readable .npz archive ({exc})") from None


def convert_npz(path: str | os.PathLike, out: str | os.PathLike, n_classes: int | None = None,
                *, nhwc: bool = False, keep_order: bool = False, shuffle_seed: int = 0) -> Path:
    """Convert an .npz with keys x_train, y_train, x_test, y_test into a psgd HDF5 dataset.

    uint8 inputs stay uint8 with scale 1/255, floats become float32 with scale 1;
    (N, H, W) images become (N, 1, H, W); ``nhwc`` transposes 4-d channels-last input.
    Rows are stored shuffled unless ``keep_order`` (see :func:`psgd.data.layout.write_dataset`).
    """
    layout.check_output_path(out)
    a = read_npz(path)
    xs, scales, ys = {}, {}, {}
    shape = a["x_train"].shape
    if not nhwc and len(shape) == 4 and shape[3] in (1, 3, 4) and shape[1] not in (1, 3, 4):
        print(f"psgd: warning: {path}: x_train has shape {shape}, which looks channels-last "
              f"(N, H, W, C); it is stored as given, read as (N, C, H, W) = {shape}: pass --nhwc "
              f"to transpose it", file=sys.stderr, flush=True)
    for split in layout.SPLITS:
        xs[split], scales[split], _ = layout.prepare_x(a[f"x_{split}"], f"{path}: x_{split}", nhwc=nhwc)
        ys[split] = layout.prepare_y(a[f"y_{split}"], f"{path}: y_{split}")
        if len(xs[split]) != len(ys[split]):
            raise ValueError(f"{path}: x_{split} has {len(xs[split])} samples but y_{split} "
                             f"has {len(ys[split])} labels")
    if n_classes is None:
        n_classes = int(max(ys["train"].max(), ys["test"].max())) + 1
    for split in layout.SPLITS:
        layout.check_labels(ys[split], n_classes, f"{path}: y_{split}")
    return layout.write_dataset(out, xs["train"], ys["train"], xs["test"], ys["test"],
                                n_classes=n_classes, scale=None, offset=0.0,
                                source=f"npz:{Path(path).name}", keep_order=keep_order, shuffle_seed=shuffle_seed)
