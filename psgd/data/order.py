"""Row order: the converters' seeded shuffle, dealing rows to workers, and how mixed a file's classes are."""
from __future__ import annotations

import numpy as np

from psgd.data.slices import slice_bounds

#: the attribute values a converter records (``row_order``, ``shuffle_seed``, ``row_order_origin``)
SHUFFLED, SOURCE = "shuffled", "source"
ORIGIN = "numpy.random.default_rng([shuffle_seed, split]).permutation(n), split 0 train, 1 test"
SPLIT_KEY = {"train": 0, "test": 1}
DEAL_KEY = 0x6465616C          # "deal": keeps the dealing stream apart from the epoch shuffles
CALIBRATION_KEY = 0x63616C69   # "cali"
BLOCK_ROWS = 1000
MIXING_WARN = 0.9


def shuffle_permutation(n: int, seed: int, split: str) -> np.ndarray:
    """The converters' permutation of a split's ``n`` source rows (int64 (n,)): row i of the file
    is source row ``perm[i]``; see :data:`ORIGIN`."""
    if seed < 0:
        raise ValueError(f"shuffle seed must be >= 0, got {seed}")
    return np.random.default_rng([int(seed), SPLIT_KEY[split]]).permutation(int(n))


def order_attrs(keep_order: bool, seed: int) -> dict:
    """The root attributes that say how a written file's rows are ordered."""
    if keep_order:
        return {"row_order": SOURCE}
    return {"row_order": SHUFFLED, "shuffle_seed": int(seed), "row_order_origin": ORIGIN}


def stated_order(attrs) -> dict:
    """``row_order`` and ``shuffle_seed`` from a file's root attributes (None where absent)."""
    row_order = attrs.get("row_order")
    seed = attrs.get("shuffle_seed")
    return {"row_order": row_order.decode() if isinstance(row_order, bytes) else row_order,
            "shuffle_seed": None if seed is None else int(seed)}


def worker_rows(n: int, worker: int, n_workers: int, seed: int, deal: bool = True) -> np.ndarray:
    """The file rows (sorted int64) of ``worker`` of ``n_workers`` in a split of ``n`` rows.

    Dealt (the default): one seeded permutation of all ``n`` rows, fixed by (seed, n), is cut
    into near-equal contiguous parts (:func:`slice_bounds`) and worker k takes part k, so
    every row goes to exactly one worker and which rows a worker gets does not depend on
    where they sit in the file.  ``deal=False``: the contiguous slice ``[lo, hi)``.
    """
    lo, hi = slice_bounds(n, worker, n_workers)
    if n_workers == 1 or not deal:
        return np.arange(lo, hi, dtype=np.int64)
    perm = np.random.default_rng([int(seed), int(n), DEAL_KEY]).permutation(int(n))
    return np.sort(perm[lo:hi])


def calibration_sample(n_local: int, n: int, seed: int, worker: int) -> np.ndarray:
    """``min(n, n_local)`` distinct local row indices drawn by (seed, worker), for batch-norm calibration."""
    rng = np.random.default_rng([int(seed), int(worker), CALIBRATION_KEY])
    return rng.choice(int(n_local), size=min(int(n), int(n_local)), replace=False)


def _block_entropy(y: np.ndarray, n_classes: int, block: int) -> np.ndarray:
    """Class entropy (nats) of each full block of ``block`` rows of ``y``."""
    m = len(y) // block
    counts = np.zeros((m, n_classes))
    np.add.at(counts, (np.repeat(np.arange(m), block), y[:m * block]), 1.0)
    p = counts / block
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(axis=1)


def block_size(n: int) -> int:
    """Rows per block for :func:`class_mixing`: 1,000, or n // 8 (at least 1) for a smaller split."""
    return BLOCK_ROWS if n >= 8 * BLOCK_ROWS else max(1, n // 8)


def class_mixing(y: np.ndarray, n_classes: int) -> dict:
    """How evenly the classes of ``y`` spread over its rows, block by block.

    ``mixing`` is the mean class entropy of the blocks of :func:`block_size` rows divided by
    what the same labels give in a seeded random order: about 1 for a shuffled file, near 0
    for one sorted by class.  ``clustered`` when it is below :data:`MIXING_WARN`.

    Returns
    -------
    dict
        ``block`` (rows), ``blocks`` (int), ``mixing`` (float), ``clustered`` (bool),
        ``worst`` (the block with the fewest classes: ``rows`` [lo, hi), ``classes`` present,
        ``top_share`` of its largest class).
    """
    y = np.asarray(y, np.int64)
    block = block_size(len(y))
    m = len(y) // block
    shuffled = np.random.default_rng(0).permutation(y)
    observed, reference = _block_entropy(y, n_classes, block), _block_entropy(shuffled, n_classes, block)
    ref = float(reference.mean()) if m else 0.0
    mixing = float(observed.mean()) / ref if ref > 0 else 1.0
    counts = np.stack([np.bincount(y[i * block:(i + 1) * block], minlength=n_classes) for i in range(m)]) \
        if m else np.zeros((0, n_classes), np.int64)
    present = (counts > 0).sum(axis=1)
    w = int(np.argmin(present)) if m else 0
    worst = {"rows": (w * block, (w + 1) * block), "classes": int(present[w]) if m else 0,
             "top_share": float(counts[w].max() / block) if m else 0.0}
    return {"block": block, "blocks": m, "mixing": mixing, "clustered": mixing < MIXING_WARN,
            "worst": worst}
