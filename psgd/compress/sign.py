"""sign (signSGD with a scale, Bernstein et al. 2018; with error feedback, Karimireddy et al. 2019):
one bit per element and each bucket's mean magnitude."""
from __future__ import annotations

import numpy as np

from psgd.compress.base import Compressor
from psgd.kernels.compress import sign_decode_add, sign_encode


class Sign(Compressor):
    name, code, biased, fixed_length = "sign", 3, True, True
    momentum_gain = True   # measured: docs/results/compression.md

    def __init__(self, bucket: int) -> None:
        self.bucket = bucket

    def max_body(self, n: int) -> int:
        return 4 * ((n + self.bucket - 1) // self.bucket) + (n + 7) // 8

    def encode_body(self, grad: np.ndarray, out: np.ndarray) -> int:
        return sign_encode(grad, self.bucket, out)

    def decode_add_body(self, body: np.ndarray, dst: np.ndarray) -> None:
        sign_decode_add(body, self.bucket, dst)
