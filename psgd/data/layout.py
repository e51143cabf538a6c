"""The psgd HDF5 dataset layout: names, attributes, validation and the writer."""
from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from psgd.atomic_file import atomic_output
from psgd.data import order
from psgd.errors import UsageError

FORMAT_VERSION = 1
SPLITS = ("train", "test")
DATASETS = tuple(f"/{split}/{part}" for split in SPLITS for part in ("x", "y"))
X_DTYPES = (np.dtype(np.uint8), np.dtype(np.float32))
Y_DTYPE = np.dtype(np.int32)
CHUNK_ROWS = 256           # rows per HDF5 chunk: about one batch
WRITE_ROWS = 16 * CHUNK_ROWS   # rows per write: whole chunks
COMPRESSION = "gzip"
COMPRESSION_LEVEL = 4
UINT8_SCALE = 1.0 / 255.0


def check_input_file(path: str | os.PathLike, what: str = "input file") -> Path:
    """Return ``path`` as a Path, or raise ValueError if it is not an existing regular file."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: {what} does not exist")
    if not p.is_file():
        raise UsageError(f"{p}: {what} is not a regular file")
    return p


def check_output_path(path: str | os.PathLike) -> Path:
    """Return ``path`` as a Path, or raise ValueError if it cannot be written as a file.

    A missing output directory is fine (the writer makes it); the nearest one
    that exists must be a directory.
    """
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{p}: output path is a directory")
    existing = next(d for d in p.absolute().parents if d.exists())
    if not existing.is_dir():
        raise UsageError(f"{p}: {existing} is not a directory")
    return p


def _make_parent(p: Path) -> None:
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{p}: cannot make output directory {p.parent} ({exc.strerror})") from None


def prepare_x(x: np.ndarray, name: str, *, nhwc: bool = False) -> tuple[np.ndarray, float, float]:
    """Bring inputs into the stored form: uint8 or float32, NCHW for images.

    Parameters
    ----------
    x : ndarray, shape (N, D), (N, H, W), (N, C, H, W) or, with ``nhwc``, (N, H, W, C)
        Samples. uint8 (or any integer/bool array within [0, 255]) is stored as
        uint8 with scale 1/255; anything else as float32 with scale 1.
    name : str
        What to call ``x`` in error messages (e.g. ``"data.npz: x_train"``).
    nhwc : bool
        Treat a 4-d ``x`` as channels-last and transpose it to NCHW.

    Returns
    -------
    x : ndarray, uint8 or float32, shape (N, D) or (N, C, H, W)
    scale, offset : float
        ``x_float = x * scale + offset``.
    """
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[:, None, :, :]
    elif x.ndim == 4 and nhwc:
        x = x.transpose(0, 3, 1, 2)
    elif x.ndim not in (2, 4):
        raise UsageError(f"{name}: expected shape (N, D), (N, H, W) or (N, C, H, W), got {x.shape}")
    if x.shape[0] == 0:
        raise UsageError(f"{name}: has no samples")
    if x.dtype.kind in "biu":
        if x.size and (x.min() < 0 or x.max() > 255):
            x = x.astype(np.float32)
        else:
            return np.ascontiguousarray(x, dtype=np.uint8), UINT8_SCALE, 0.0
    elif x.dtype.kind != "f":
        raise UsageError(f"{name}: expected numeric samples, got dtype {x.dtype}")
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    check_finite(x32, name)
    return x32, 1.0, 0.0


def check_finite(x: np.ndarray, name: str, first_row: int = 0) -> None:
    """Raise ValueError if float array ``x`` holds a NaN or an Inf (naming the first bad row).

    ``first_row`` is the file row of ``x[0]``, so the message names rows of the file.
    """
    if x.dtype.kind != "f":
        return
    bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1) if x.ndim > 1 else ~np.isfinite(x)
    if bad.any():
        row = first_row + int(np.flatnonzero(bad)[0])
        raise UsageError(f"{name}: contains NaN or Inf ({int(bad.sum())} bad samples, first at row {row})")


def prepare_y(y: np.ndarray, name: str) -> np.ndarray:
    """Return labels ``y`` (shape (N,), integer class ids) as int32, or raise ValueError."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise UsageError(f"{name}: labels must have shape (N,), got {y.shape}")
    if y.dtype.kind == "f":
        if not np.isfinite(y).all() or (y != np.round(y)).any():
            raise UsageError(f"{name}: labels must be integer class ids, got non-integral {y.dtype} values")
    elif y.dtype.kind not in "biu":
        raise UsageError(f"{name}: labels must be integer class ids, got dtype {y.dtype}")
    if y.size and (y.min() < np.iinfo(np.int32).min or y.max() > np.iinfo(np.int32).max):
        raise UsageError(f"{name}: label values {y.min()}..{y.max()} do not fit int32")
    return y.astype(Y_DTYPE)


def check_labels(y: np.ndarray, n_classes: int, name: str) -> None:
    """Raise ValueError unless every label in ``y`` lies in [0, n_classes)."""
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise UsageError(f"{name}: label {int(y[i])} at row {i} is outside [0, {n_classes}) "
                         f"({int(bad.sum())} such labels)")


def write_dataset(path: str | os.PathLike, x_train: np.ndarray, y_train: np.ndarray,
                  x_test: np.ndarray, y_test: np.ndarray, n_classes: int | None = None,
                  scale: float | None = None, offset: float = 0.0, source: str = "",
                  normalize: bool = False, keep_order: bool = False, shuffle_seed: int = 0) -> Path:
    """Validate the four arrays and write them atomically as one psgd HDF5 dataset.

    Parameters
    ----------
    path : path-like
        Output file; its directory is made if missing. Written to a temporary file in
        the same directory, fsynced and renamed, so no partial file remains on error.
    x_train, x_test : ndarray, shape (N, D), (N, H, W) or (N, C, H, W), uint8 or float
        Samples; (N, H, W) becomes (N, 1, H, W).
    y_train, y_test : ndarray, shape (N,), integer
        Class ids in [0, n_classes).
    n_classes : int, optional
        Number of classes; default max label + 1.
    scale, offset : float
        ``x_float = x * scale + offset``; ``scale`` defaults to 1/255 for uint8, 1 for float.
    source : str
        Where the data came from (stored as the ``source`` attribute).
    normalize : bool
        For (N, C, H, W) images: also store the train split's per-channel mean and
        standard deviation of ``x * scale + offset`` as ``channel_mean`` and
        ``channel_std``, which the reader subtracts and divides by.
    keep_order : bool
        Store the rows in the order given.  By default each split is stored in the seeded
        order of :func:`psgd.data.order.shuffle_permutation`, so a source sorted by class
        does not come out sorted; the attributes ``row_order``, ``shuffle_seed`` and
        ``row_order_origin`` record which.
    shuffle_seed : int
        Seed of that permutation.

    Returns
    -------
    Path
        The written file.
    """
    out = check_output_path(path)
    xs, ys, x_scale = _prepare_splits(out, {"train": (x_train, y_train), "test": (x_test, y_test)})
    attrs = {"n_classes": _check_classes(out, ys, n_classes),
             "scale": float(x_scale if scale is None else scale), "offset": float(offset),
             "source": str(source), "format_version": FORMAT_VERSION,
             **order.order_attrs(keep_order, shuffle_seed)}
    perms = {split: None if keep_order else order.shuffle_permutation(len(ys[split]), shuffle_seed, split)
             for split in SPLITS}
    if not _scaling_ok(attrs["scale"], attrs["offset"]):
        raise UsageError(f"{out}: scale must be finite and non-zero and offset finite, "
                         f"got scale={attrs['scale']} offset={attrs['offset']}")
    if normalize and xs["train"].ndim == 4:
        attrs["channel_mean"], attrs["channel_std"] = channel_stats(xs["train"], attrs["scale"],
                                                                    attrs["offset"])
    _make_parent(out)
    with atomic_output(out) as tmp:
        _write_file(tmp, attrs, xs, ys, perms)
    return out


def channel_stats(x: np.ndarray, scale: float, offset: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and standard deviation (float64 (C,)) of ``x * scale + offset``, x (N, C, H, W).

    A channel that never varies gets std 1, so normalising leaves it centred, not infinite.
    """
    c = x.shape[1]
    s1, s2, n = np.zeros(c), np.zeros(c), 0
    for lo in range(0, len(x), 1024):   # bounded memory
        v = x[lo:lo + 1024].astype(np.float64) * scale + offset
        s1 += v.sum(axis=(0, 2, 3))
        s2 += (v * v).sum(axis=(0, 2, 3))
        n += v.shape[0] * v.shape[2] * v.shape[3]
    mean = s1 / n
    std = np.sqrt(np.maximum(s2 / n - mean ** 2, 0.0))
    return mean, np.where(std > 0, std, 1.0)


def _prepare_splits(out: Path, arrays: dict) -> tuple[dict, dict, float]:
    """Stored x and y of each split, checked against each other, and the scale of x."""
    xs, ys, scales = {}, {}, []
    for split, (x, y) in arrays.items():
        xs[split], s, _ = prepare_x(x, f"{out}: {split} x")
        scales.append(s)
        ys[split] = prepare_y(y, f"{out}: {split} y")
        if len(xs[split]) != len(ys[split]):
            raise UsageError(f"{out}: {split} has {len(xs[split])} samples but {len(ys[split])} labels")
    if xs["train"].shape[1:] != xs["test"].shape[1:]:
        raise UsageError(f"{out}: train samples have shape {xs['train'].shape[1:]} but test "
                         f"samples {xs['test'].shape[1:]}")
    if xs["train"].dtype != xs["test"].dtype:  # one scale for both splits
        xs = {k: v.astype(np.float32) * np.float32(s) for (k, v), s in zip(xs.items(), scales)}
        scales = [1.0, 1.0]
    return xs, ys, scales[0]


def _check_classes(out: Path, ys: dict, n_classes: int | None) -> int:
    """``n_classes`` (default max label + 1), checked against every split's labels."""
    if n_classes is None:
        n_classes = int(max(ys["train"].max(), ys["test"].max())) + 1
    n_classes = int(n_classes)
    if n_classes < 1:
        raise UsageError(f"{out}: number of classes must be >= 1, got {n_classes}")
    for split in SPLITS:
        check_labels(ys[split], n_classes, f"{out}: {split} y")
    return n_classes


def _write_file(path: Path, attrs: dict, xs: dict, ys: dict, perms: dict) -> None:
    with h5py.File(path, "w", track_order=True) as f:
        for key, value in attrs.items():
            f.attrs[key] = value
        for split in SPLITS:
            g = f.create_group(split, track_order=True)
            _create(g, "x", xs[split], perms[split])
            _create(g, "y", ys[split], perms[split])


def _scaling_ok(scale: float, offset: float) -> bool:
    """Whether ``x * scale + offset`` is a usable input scaling: both finite, scale non-zero."""
    return bool(np.isfinite(scale) and scale != 0 and np.isfinite(offset))


def _create(group: h5py.Group, name: str, data: np.ndarray, perm: np.ndarray | None) -> None:
    """Write ``data`` (rows in the order ``perm``, when given) as chunked, compressed ``group/name``."""
    rows = max(1, min(CHUNK_ROWS, len(data)))
    ds = group.create_dataset(name, shape=data.shape, dtype=data.dtype, chunks=(rows, *data.shape[1:]),
                              compression=COMPRESSION, compression_opts=COMPRESSION_LEVEL,
                              shuffle=data.dtype.itemsize > 1, track_times=False)
    step = WRITE_ROWS
    for lo in range(0, len(data), step):   # a block at a time: no second copy of the split
        ds[lo:lo + step] = data[lo:lo + step] if perm is None else data[perm[lo:lo + step]]


def open_checked(path: str | os.PathLike) -> h5py.File:
    """Open a psgd dataset read-only after checking its layout; the caller closes it.

    Raises
    ------
    ValueError
        Naming the file and the problem: missing file, not HDF5, a missing
        dataset, wrong dtypes or shapes, x/y length mismatch, bad attributes.
    """
    p = check_input_file(path, "dataset file")
    if not h5py.is_hdf5(p):
        raise UsageError(f"{p}: not an HDF5 file")
    try:
        f = h5py.File(p, "r")
    except OSError as exc:
        raise UsageError(f"{p}: cannot open as HDF5 ({exc})") from None
    try:
        check_layout(f, p)
    except BaseException:
        f.close()
        raise
    return f


def check_layout(f: h5py.File, name: str | os.PathLike) -> dict:
    """Check an open file against the layout and return its attributes as plain Python values."""
    for ds in DATASETS:
        obj = f.get(ds)
        if obj is None:
            raise UsageError(f"{name}: missing dataset {ds}")
        if not isinstance(obj, h5py.Dataset):
            raise UsageError(f"{name}: {ds} is not a dataset")
    for split in SPLITS:
        x, y = f[split]["x"], f[split]["y"]
        if x.dtype not in X_DTYPES:
            raise UsageError(f"{name}: /{split}/x has dtype {x.dtype}, expected uint8 or float32")
        if x.ndim not in (2, 4):
            raise UsageError(f"{name}: /{split}/x has shape {x.shape}, expected (N, D) or (N, C, H, W)")
        if y.dtype.kind not in "iu" or y.ndim != 1:
            raise UsageError(f"{name}: /{split}/y must be integer class ids of shape (N,), "
                             f"got {y.dtype} {y.shape}")
        if x.shape[0] != y.shape[0]:
            raise UsageError(f"{name}: /{split}/x has {x.shape[0]} rows but /{split}/y has {y.shape[0]}")
    if f["train/x"].shape[1:] != f["test/x"].shape[1:]:
        raise UsageError(f"{name}: /train/x samples have shape {f['train/x'].shape[1:]} but /test/x "
                         f"samples {f['test/x'].shape[1:]}")
    attrs = {}
    for key in ("n_classes", "scale", "offset", "format_version"):
        if key not in f.attrs:
            raise UsageError(f"{name}: missing root attribute '{key}'")
        value = np.asarray(f.attrs[key])
        if value.shape != () or value.dtype.kind not in "iuf":
            raise UsageError(f"{name}: root attribute '{key}' must be a number, got {f.attrs[key]!r}")
        attrs[key] = value.item()
    if float(attrs["n_classes"]) != int(attrs["n_classes"]) or attrs["n_classes"] < 1:
        raise UsageError(f"{name}: attribute n_classes must be a positive integer, got {attrs['n_classes']}")
    attrs["n_classes"] = int(attrs["n_classes"])
    if int(attrs["format_version"]) != FORMAT_VERSION:
        raise UsageError(f"{name}: format_version {attrs['format_version']} is not supported "
                         f"(this psgd reads version {FORMAT_VERSION})")
    attrs["format_version"] = int(attrs["format_version"])
    attrs["scale"], attrs["offset"] = float(attrs["scale"]), float(attrs["offset"])
    if not _scaling_ok(attrs["scale"], attrs["offset"]):
        raise UsageError(f"{name}: attributes scale={attrs['scale']} offset={attrs['offset']} "
                         f"must be finite with scale non-zero")
    source = f.attrs.get("source", "")
    attrs["source"] = source.decode() if isinstance(source, bytes) else str(source)
    attrs["channel_mean"] = attrs["channel_std"] = None
    if "channel_mean" in f.attrs or "channel_std" in f.attrs:
        c = f["train/x"].shape[1]
        for key in ("channel_mean", "channel_std"):
            value = np.asarray(f.attrs.get(key, []), dtype=np.float64)
            if value.shape != (c,) or f["train/x"].ndim != 4 or not np.isfinite(value).all():
                raise UsageError(f"{name}: attribute {key} must hold {c} finite numbers, one per "
                                 f"channel of (N, C, H, W) images (and channel_mean and "
                                 f"channel_std go together), got {f.attrs.get(key)!r}")
            attrs[key] = value.tolist()
        if min(attrs["channel_std"]) <= 0:
            raise UsageError(f"{name}: attribute channel_std must be positive, got {attrs['channel_std']}")
    return attrs
