"""On-the-fly augmentation of an image batch on the worker: random crop with zero padding and horizontal flip."""
from __future__ import annotations

import numpy as np


def crop_flip(x: np.ndarray, rng: np.random.Generator, pad: int) -> np.ndarray:
    """Each image shifted by a random crop of its ``pad``-padded self, and flipped left-right half the time.

    Parameters
    ----------
    x : (B, C, H, W) float32
    rng : numpy Generator; draws 3 integers per image (two offsets, the flip)
    pad : int >= 0, the zero padding on every side (the crop offset is in [-pad, pad])

    Returns
    -------
    (B, C, H, W) float32, a new array
    """
    b, c, h, w = x.shape
    padded = np.zeros((b, c, h + 2 * pad, w + 2 * pad), x.dtype)
    padded[:, :, pad:pad + h, pad:pad + w] = x
    offs = rng.integers(0, 2 * pad + 1, size=(b, 2))
    flips = rng.integers(0, 2, size=b).astype(bool)
    out = np.empty_like(x)
    for i in range(b):
        r, s = offs[i]
        crop = padded[i, :, r:r + h, s:s + w]
        out[i] = crop[:, :, ::-1] if flips[i] else crop
    return out
