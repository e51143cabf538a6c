"""MNIST-style IDX files (gzip or raw): reader, writer and the IDX-to-HDF5 converter."""
from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

from psgd.data import layout
from psgd.errors import UsageError

GZIP_MAGIC = b"\x1f\x8b"
# IDX type code -> big-endian numpy dtype
IDX_DTYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
              0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
IDX_CODES = {v.newbyteorder("="): k for k, v in IDX_DTYPES.items()}
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as fh:
        head = fh.read(2)
    if head != GZIP_MAGIC:
        if path.suffix == ".gz":
            raise UsageError(f"{path}: named .gz but is not gzip-compressed (no gzip magic bytes)")
        return path.read_bytes()
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read()
    except EOFError:
        raise UsageError(f"{path}: truncated gzip file (compressed stream ends early)") from None
    except (gzip.BadGzipFile, zlib.error) as exc:
        raise UsageError(f"{path}: corrupt gzip file ({exc})") from None


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file, gzip-compressed or raw (detected by its magic bytes).

    Parameters
    ----------
    path : path-like
        An IDX file: 2 zero bytes, a type code, the number of dimensions, one
        big-endian uint32 per dimension, then the data.

    Returns
    -------
    ndarray
        Shape as the header says, native byte order (uint8 for MNIST).

    Raises
    ------
    ValueError
        Missing file, wrong magic number, or a data section shorter or longer
        than the header promises.
    """
    p = layout.check_input_file(path, "IDX file")
    raw = _read_bytes(p)
    if len(raw) < 4:
        raise UsageError(f"{p}: truncated IDX file ({len(raw)} bytes, shorter than the 4-byte magic number)")
    magic = int.from_bytes(raw[:4], "big")
    code, ndim = raw[2], raw[3]
    if raw[:2] != b"\0\0" or code not in IDX_DTYPES or ndim == 0:
        raise UsageError(f"{p}: not an IDX file (magic number 0x{magic:08x}; expected "
                         f"0x{IMAGES_MAGIC:08x} for images or 0x{LABELS_MAGIC:08x} for labels)")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UsageError(f"{p}: truncated IDX file (header needs {header} bytes, file has {len(raw)})")
    dims = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    dtype = IDX_DTYPES[code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    found = len(raw) - header
    if found < expected:
        raise UsageError(f"{p}: truncated IDX file (header says {dims}, needing {expected} data bytes, "
                         f"found {found})")
    if found > expected:
        raise UsageError(f"{p}: IDX file has {found - expected} unexpected bytes after the data "
                         f"(header says {dims})")
    return np.frombuffer(raw, dtype=dtype, count=expected // dtype.itemsize,
                         offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def read_idx_images(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX images file (magic 0x00000803) as NCHW.

    Returns
    -------
    ndarray, uint8 (or the file's type), shape (N, 1, H, W)
    """
    a = read_idx(path)
    if a.ndim == 1:
        raise UsageError(f"{path}: this is an IDX labels file (1 dimension, {a.shape[0]} entries), "
                         f"expected an images file (3 dimensions: N, H, W)")
    if a.ndim != 3:
        raise UsageError(f"{path}: expected an IDX images file with 3 dimensions (N, H, W), got {a.shape}")
    return a[:, None, :, :]


def read_idx_labels(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX labels file (magic 0x00000801).

    Returns
    -------
    ndarray, integer, shape (N,)
    """
    a = read_idx(path)
    if a.ndim != 1:
        kind = "an IDX images file" if a.ndim == 3 else f"an IDX file with shape {a.shape}"
        raise UsageError(f"{path}: this is {kind}, expected a labels file (1 dimension)")
    if a.dtype.kind not in "iu":
        raise UsageError(f"{path}: labels must be integers, IDX type is {a.dtype}")
    return a


def write_idx(path: str | os.PathLike, array: np.ndarray, *, gz: bool | None = None) -> None:
    """Write ``array`` (uint8, int8, int16, int32, float32 or float64) as an IDX file.

    ``gz`` compresses with gzip; by default when ``path`` ends in ``.gz``.
    """
    a = np.asarray(array)
    code = IDX_CODES.get(a.dtype.newbyteorder("="))
    if code is None:
        raise UsageError(f"{path}: IDX cannot store dtype {a.dtype}")
    body = (bytes([0, 0, code, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
            + a.astype(IDX_DTYPES[code]).tobytes())
    if gz is None:
        gz = str(path).endswith(".gz")
    Path(path).write_bytes(gzip.compress(body, mtime=0) if gz else body)


def convert_idx(train_images: str | os.PathLike, train_labels: str | os.PathLike,
                test_images: str | os.PathLike, test_labels: str | os.PathLike,
                out: str | os.PathLike, n_classes: int | None = None, keep_order: bool = False, shuffle_seed: int = 0) -> Path:
    """Convert four MNIST-style IDX files into one psgd HDF5 dataset at ``out``.

    Images (N, H, W) are stored as (N, 1, H, W) uint8 with scale 1/255; labels
    as int32. ``n_classes`` defaults to max label + 1.  Rows are stored shuffled unless
    ``keep_order`` (see :func:`psgd.data.layout.write_dataset`).
    """
    layout.check_output_path(out)
    arrays = {}
    for split, images, labels in (("train", train_images, train_labels), ("test", test_images, test_labels)):
        x, y = read_idx_images(images), read_idx_labels(labels)
        if len(x) != len(y):
            raise UsageError(f"{images}: has {len(x)} images but {labels} has {len(y)} labels")
        arrays[split] = (x, y)
    if n_classes is None:
        n_classes = int(max(arrays["train"][1].max(), arrays["test"][1].max())) + 1
    for labels, (_, y) in zip((train_labels, test_labels), arrays.values()):
        layout.check_labels(y, n_classes, str(labels))
    source = f"idx:{Path(train_images).name},{Path(train_labels).name}," \
             f"{Path(test_images).name},{Path(test_labels).name}"
    scale = layout.UINT8_SCALE if arrays["train"][0].dtype == np.uint8 else None
    return layout.write_dataset(out, *arrays["train"], *arrays["test"], n_classes=n_classes,
                                scale=scale, offset=0.0, source=source, keep_order=keep_order, shuffle_seed=shuffle_seed)
