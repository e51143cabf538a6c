"""fp16: each element rounded to IEEE half precision (2 bytes); unbiased only up to rounding."""
from __future__ import annotations

import numpy as np

from psgd.compress.base import Compressor


class Fp16(Compressor):
    name, code, biased = "fp16", 1, False

    def max_body(self, n: int) -> int:
        return 2 * n

    def encode_body(self, grad: np.ndarray, out: np.ndarray) -> int:
        out[:2 * grad.shape[0]].view(np.float16)[:] = grad
        return 2 * grad.shape[0]

    def decode_add_body(self, body: np.ndarray, dst: np.ndarray) -> None:
        np.add(dst, body[:2 * dst.shape[0]].view(np.float16), out=dst, casting="unsafe")
