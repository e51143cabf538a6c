"""qsgd:BITS (Alistarh et al. 2017): per bucket a scale (its largest magnitude, or with
``qsgd:BITS:l2`` its L2 norm), per element an unbiased signed level."""
from __future__ import annotations

import numpy as np

from psgd.compress.base import Compressor
from psgd.kernels.compress import LANES, qsgd_decode_add, qsgd_encode

SCALES = ("max", "l2")    # qsgd:BITS:SCALE: a bucket's largest magnitude or its L2 norm
DEFAULT_SCALE = "max"     # what qsgd:BITS means: the same bytes, a sixth of l2's variance


def _splitmix64(z: int) -> int:
    """Vigna's splitmix64 of ``z``: a bijection of 64-bit ints that seeds xorshift streams."""
    z = (z + 0x9E3779B97F4A7C15) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return z ^ (z >> 31)


class Qsgd(Compressor):
    """``2**bits - 1`` levels per element, ``{-s..s} * norm / s`` with s = 2**(bits-1) - 1;
    for ``bits`` = 1 the two levels ``+-norm`` (no zero); the norm is the bucket's largest
    magnitude (``scale`` max, the default) or its L2 norm (l2)."""

    code, biased, fixed_length = 2, False, True

    def __init__(self, bits: int, bucket: int, seed: int = 0,
                 scale: str = DEFAULT_SCALE) -> None:
        self.bits, self.bucket, self.maxnorm = bits, bucket, scale == "max"
        self.name = f"qsgd:{bits}" if scale == DEFAULT_SCALE else f"qsgd:{bits}:{scale}"
        # the random rounding's xorshift64 streams (never 0), repeatable from the seed
        self.state = np.array([_splitmix64(seed * LANES + k) or 1 for k in range(LANES)],
                              np.uint64)

    def max_body(self, n: int) -> int:
        return 4 * ((n + self.bucket - 1) // self.bucket) + (n * self.bits + 7) // 8

    def encode_body(self, grad: np.ndarray, out: np.ndarray) -> int:
        return qsgd_encode(grad, self.bits, self.bucket, out, self.state, self.maxnorm)

    def decode_add_body(self, body: np.ndarray, dst: np.ndarray) -> None:
        qsgd_decode_add(body, self.bits, self.bucket, dst)
