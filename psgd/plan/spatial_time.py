"""A ``--spatial`` part's conv layers, timed as the part runs them: by im2col on a slab of
its output rows plus the kernel's halo (:class:`psgd.tensor.spatial.SpatialWindow`), where
the whole model may run them by Winograd; for the planner's spatial rows."""
from __future__ import annotations

import time

import numpy as np

PARTS = 2        # the part count timed; other counts scale its difference by 2 / P


def extra_s(layers, batch: int, repeats: int = 3) -> float:
    """Seconds per sample by which one of :data:`PARTS` parts' conv layers (forward, backward
    and the slab's fill) exceed the whole layers' 1 / PARTS share, over the Conv2D layers
    among ``layers`` (the leading layers the split takes); may be negative."""
    from psgd.nn.layers import Conv2D
    total = 0.0
    for la in layers:
        if not isinstance(la, Conv2D):
            continue
        (h, w, c), (oh, _, f) = la.in_shape, la.out_shape
        whole = Conv2D(la.in_shape, f, (la.kh, la.kw), la.stride, la.pad, winograd=la.winograd)
        rows = (-(-oh // PARTS) - 1) * la.stride + la.kh
        slab = Conv2D((rows, w + 2 * la.pad, c), f, (la.kh, la.kw), la.stride, 0, winograd=False)
        total += _seconds(slab, batch, repeats, fill=True) - _seconds(whole, batch, repeats) / PARTS
    return total / batch


def _seconds(conv, batch: int, repeats: int, fill: bool = False) -> float:
    """Best forward + backward seconds of ``conv`` (random weights) on a random batch; with
    ``fill``, zeroing and filling its input first, as a slab is."""
    rng = np.random.default_rng(0)
    params = {k: 0.01 * rng.standard_normal(s).astype(np.float32) for k, s in conv.param_shapes()}
    conv.bind(params, {k: np.zeros_like(v) for k, v in params.items()})
    x = rng.standard_normal((batch, *conv.in_shape)).astype(np.float32)
    src, dy = x.copy(), np.ones((batch, *conv.out_shape), np.float32)
    best = np.inf
    for _ in range(repeats + 1):          # the first compiles
        t = time.perf_counter()
        if fill:
            x[...] = 0
            np.copyto(x, src)
        conv.forward(x)
        conv.backward(dy, need_dx=True)
        best = min(best, time.perf_counter() - t)
    return best
