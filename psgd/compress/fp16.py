"""fp16: each element rounded to IEEE half precision (2 bytes), to nearest even."""
from __future__ import annotations

import numpy as np

from psgd.compress.base import Compressor
from psgd.kernels.compress import HALF_TO_FLOAT, fp16_decode_add, fp16_encode


class Fp16(Compressor):
    name, code, biased, summable, fixed_length = "fp16", 1, False, True, True

    def max_body(self, n: int) -> int:
        return 2 * n

    def encode_body(self, grad: np.ndarray, out: np.ndarray) -> int:
        return fp16_encode(grad, out)

    def decode_add_body(self, body: np.ndarray, dst: np.ndarray) -> None:
        fp16_decode_add(body, HALF_TO_FLOAT, dst)
