"""A compressor's ratio and codec seconds per byte, measured on this core, for the cost model
(`psgd plan --compress`) and the search's compressed rows (stored in a profile)."""
from __future__ import annotations

import time

from psgd.errors import PsgdError
from psgd.plan.cost import NONE, Compression

# the compressors the search tries in the data-parallel rows
SEARCHED = ("fp16", "qsgd:4", "topk:0.01", "sign")
MEASURED_VALUES = 1 << 23      # the most gradient values a codec is timed on (32 MB)


def measure_compression(spec: str, bucket: int, n_params: int, seconds: float = 0.5,
                        touched: float | None = None) -> Compression:
    """``spec``'s ratio and encode and decode seconds per float32 byte, measured on this core
    on a normal gradient of ``n_params`` elements (at most :data:`MEASURED_VALUES`: a
    smaller vector times faster per byte, from the caches; ``touched``: a sparse model's
    gradient, nonzero on that many coordinates, in proportion). Encoding counts what a
    worker does once a step besides decoding the frames: the error-feedback residual's passes
    (:func:`residual`), clearing the sum and taking its mean."""
    import numpy as np

    from psgd.collectives.compressed import _Whole
    from psgd.compress import make
    from psgd.compress.feedback import PushEncoder
    try:
        comp = make(spec, bucket, seed=1)
    except ValueError as exc:
        raise PsgdError(str(exc)) from None
    if comp is None:
        return NONE
    n = min(n_params, MEASURED_VALUES)
    rng = np.random.default_rng(0)
    g = rng.standard_normal(n).astype(np.float32)
    if touched is not None:
        g[rng.permutation(n)[max(1, round(touched * n / n_params)):]] = 0.0
    encoder = PushEncoder(comp, _Whole(n), residual(spec) and not comp.summable)
    frame, dst = encoder.encode(g)[0], np.zeros(n, np.float32)
    comp.decode_add(frame, dst)                 # compile

    def encode():
        encoder.encode(g)
        dst[:] = 0.0
        np.divide(dst, 2, out=dst)

    def per_byte(fn):
        steps, start = 0, time.perf_counter()
        while steps < 3 or time.perf_counter() - start < seconds / 2:
            fn()
            steps += 1
        return (time.perf_counter() - start) / steps / (4 * n)

    encode_s = per_byte(encode)
    decode_s = per_byte(lambda: comp.decode_add(frame, dst))
    return Compression(4 * n / frame.size, encode_s, decode_s, ring=comp.summable)


def residual(spec: str) -> bool:
    """Whether a worker keeps an error-feedback residual (a parameter-sized vector) under
    ``spec`` with --error-feedback auto (the biased compressors)."""
    from psgd.compress import feedback_on
    return feedback_on(spec, "auto")
