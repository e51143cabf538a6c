"""A deterministic synthetic 10-class image dataset that needs no download: 1x28x28, or 3x32x32 in colour."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from psgd.data import layout

N_CLASSES = 10
SIDE = 28
PAD = 4                     # canvas margin so shifted strokes never wrap
N_STROKES = 12              # shared pool of strokes; classes are combinations of them
PROTOTYPE_SEED = 20240601   # fixes the task (strokes, class recipes); `seed` fixes the samples
MAX_SHIFT = 2               # whole-image shift, pixels
MAX_JITTER = 1              # extra per-stroke shift, pixels
NOISE = 0.10                # background noise (std, in [0, 1] intensity units)
DISTRACTOR_P = 0.35         # chance of one extra faint stroke from the pool
LABEL_NOISE = 0.0
COLOUR_SIDE = 32            # colour images: the 28x28 strokes at a random offset on a 32x32 canvas
# Each class is two alternative "styles", each a set of pool strokes.  Styles
# share strokes across classes (and pairs of classes are mixtures of the same
# strokes), so class means are nearly linearly dependent: a linear model cannot
# separate them, while a model that detects stroke conjunctions can.
RECIPES = (
    ((0, 1, 2), (3, 4, 5)),
    ((0, 3, 6), (1, 4, 7)),
    ((1, 5, 8), (2, 3, 9)),
    ((2, 4, 10), (0, 5, 11)),
    ((6, 7, 8), (9, 10, 11)),
    ((0, 7, 9), (4, 8, 11)),
    ((1, 6, 10), (2, 5, 7)),
    ((3, 8, 10), (0, 6, 11)),
    ((4, 9, 6), (1, 3, 11)),
    ((5, 9, 10), (2, 7, 8)),
)


def _render_stroke(rng: np.random.Generator) -> np.ndarray:
    """One smooth stroke (a quadratic Bezier drawn with Gaussian dots) on the padded canvas."""
    size = SIDE + 2 * PAD
    lo, hi = PAD + 5, PAD + SIDE - 6
    p0, p1, p2 = rng.uniform(lo, hi, size=(3, 2))
    while np.hypot(*(p2 - p0)) < 8:  # not too short
        p2 = rng.uniform(lo, hi, size=2)
    t = np.linspace(0, 1, 24)[:, None]
    pts = (1 - t) ** 2 * p0 + 2 * (1 - t) * t * p1 + t ** 2 * p2
    width = rng.uniform(0.9, 1.4)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    d2 = (yy[None] - pts[:, 0, None, None]) ** 2 + (xx[None] - pts[:, 1, None, None]) ** 2
    img = np.exp(-d2 / (2 * width ** 2)).max(axis=0)
    return img / img.max()


def prototypes() -> np.ndarray:
    """The stroke pool: float64, shape (N_STROKES, 28 + 2*PAD, 28 + 2*PAD), values in [0, 1]."""
    rng = np.random.default_rng(PROTOTYPE_SEED)
    return np.stack([_render_stroke(rng) for _ in range(N_STROKES)])


def _shifted_table(pool: np.ndarray) -> np.ndarray:
    """Every stroke at every shift: float32, shape (N_STROKES, 2s+1, 2s+1, 28*28), s = shift + jitter."""
    s = MAX_SHIFT + MAX_JITTER
    table = np.empty((len(pool), 2 * s + 1, 2 * s + 1, SIDE * SIDE), dtype=np.float32)
    for i in range(2 * s + 1):
        for j in range(2 * s + 1):
            r, c = PAD - s + i, PAD - s + j
            table[:, i, j] = pool[:, r:r + SIDE, c:c + SIDE].reshape(len(pool), -1)
    return table


def _sample(n: int, rng: np.random.Generator, pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = rng.permutation(np.arange(n) % N_CLASSES)  # balanced classes
    style = rng.integers(0, 2, size=n)
    recipes = np.asarray(RECIPES)[y, style]                         # (n, 3) stroke ids
    shift = rng.integers(-MAX_SHIFT, MAX_SHIFT + 1, size=(n, 1, 2))
    jitter = rng.integers(-MAX_JITTER, MAX_JITTER + 1, size=(n, 4, 2))
    amp = rng.uniform(0.5, 1.0, size=(n, 4)) * rng.uniform(0.6, 1.0, size=(n, 1))
    extra = rng.integers(0, N_STROKES, size=n)
    amp[:, 3] *= (rng.random(n) < DISTRACTOR_P) * 0.6
    strokes = np.concatenate([recipes, extra[:, None]], axis=1)    # (n, 4)
    offs = PAD - (shift + jitter)                                   # top-left corner in the canvas
    table = _shifted_table(pool)                                    # (strokes, 2S+1, 2S+1, 784)
    noise = rng.normal(0.0, NOISE, size=(n, SIDE * SIDE)).astype(np.float32)
    x = np.empty((n, SIDE * SIDE), dtype=np.float32)
    s = MAX_SHIFT + MAX_JITTER
    for lo in range(0, n, 1024):                                    # bounded memory
        hi = min(n, lo + 1024)
        r, c = offs[lo:hi, :, 0] - PAD + s, offs[lo:hi, :, 1] - PAD + s
        parts = table[strokes[lo:hi], r, c] * amp[lo:hi, :, None].astype(np.float32)
        x[lo:hi] = parts.max(axis=1)
    x += noise
    if LABEL_NOISE:
        flip = rng.random(n) < LABEL_NOISE
        y = np.where(flip, rng.integers(0, N_CLASSES, size=n), y)
    x8 = np.rint(np.clip(x, 0.0, 1.0) * 255).astype(np.uint8)
    return x8.reshape(n, 1, SIDE, SIDE), y.astype(np.int32)


def _colourise(x8: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(n, 1, 28, 28) uint8 strokes -> (n, 3, 32, 32) uint8: random background and (brighter)
    stroke colours per sample (the class is in the shapes only), a random placement, colour noise."""
    n = len(x8)
    v = x8.astype(np.float32) / 255.0                               # (n, 1, 28, 28)
    bg = rng.uniform(0.0, 0.2, size=(n, 3, 1, 1)).astype(np.float32)
    fg = bg + rng.uniform(0.4, 0.8, size=(n, 3, 1, 1)).astype(np.float32)   # brighter in every channel
    # a gentle left-to-right background gradient of its own colour
    ramp = np.linspace(-1, 1, COLOUR_SIDE, dtype=np.float32)[None, None, None, :]
    tilt = rng.uniform(-0.05, 0.05, size=(n, 3, 1, 1)).astype(np.float32)
    canvas = np.broadcast_to(bg + tilt * ramp, (n, 3, COLOUR_SIDE, COLOUR_SIDE)).copy()
    at = rng.integers(0, COLOUR_SIDE - SIDE + 1, size=(n, 2))
    for i in range(n):
        r, c = at[i]
        patch = canvas[i, :, r:r + SIDE, c:c + SIDE]
        canvas[i, :, r:r + SIDE, c:c + SIDE] = patch * (1 - v[i]) + fg[i] * v[i]
    canvas += rng.normal(0.0, NOISE / 2, size=canvas.shape).astype(np.float32)
    return np.rint(np.clip(canvas, 0.0, 1.0) * 255).astype(np.uint8)


def make_synthetic(n_train: int = 12000, n_test: int = 2000, seed: int = 0, channels: int = 1
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Generate the synthetic dataset; the same ``seed`` gives identical arrays.

    Every class is one of two styles, each three smooth strokes drawn from a
    shared pool of 12, with a random shift of up to 2 px, per-stroke jitter of
    1 px, random stroke amplitudes, an occasional faint distractor stroke and
    Gaussian background noise. The train and test sets come from independent
    streams of ``seed``, so changing ``n_train`` does not change the test set.

    With ``channels=3`` each sample is then coloured: a random stroke colour and a
    random background colour with a slight gradient, placed at a random offset on a
    32x32 canvas, with colour noise; the class is in the shapes only.

    Returns
    -------
    x_train : ndarray, uint8, shape (n_train, 1, 28, 28) or (n_train, 3, 32, 32)
    y_train : ndarray, int32, shape (n_train,), values in [0, 10)
    x_test : ndarray, uint8, shape (n_test, 1, 28, 28) or (n_test, 3, 32, 32)
    y_test : ndarray, int32, shape (n_test,)
    """
    if n_train < 1 or n_test < 1:
        raise ValueError(f"synthetic dataset needs at least 1 train and 1 test sample, "
                         f"got train={n_train} test={n_test}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if channels not in (1, 3):
        raise ValueError(f"synthetic data has 1 or 3 channels, got {channels}")
    pool = prototypes()
    x_train, y_train = _sample(int(n_train), np.random.default_rng([int(seed), 0]), pool)
    x_test, y_test = _sample(int(n_test), np.random.default_rng([int(seed), 1]), pool)
    if channels == 3:
        x_train = _colourise(x_train, np.random.default_rng([int(seed), 2]))
        x_test = _colourise(x_test, np.random.default_rng([int(seed), 3]))
    return x_train, y_train, x_test, y_test


def write_synthetic(path: str | os.PathLike, n_train: int = 12000, n_test: int = 2000,
                    seed: int = 0, channels: int = 1) -> Path:
    """Generate the synthetic dataset and write it to ``path`` (uint8, scale 1/255; colour
    images also with per-channel normalisation)."""
    layout.check_output_path(path)
    arrays = make_synthetic(n_train, n_test, seed, channels)
    colour = ",channels=3" if channels == 3 else ""
    return layout.write_dataset(path, *arrays, n_classes=N_CLASSES, scale=layout.UINT8_SCALE,
                                offset=0.0, source=f"synth:seed={seed}{colour}",
                                normalize=channels == 3)
