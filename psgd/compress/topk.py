"""topk:FRACTION: the largest magnitudes of a slice, sent as index + value (Aji & Heafield 2017)."""
from __future__ import annotations

import math

import numpy as np

from psgd.compress.base import Compressor
from psgd.kernels.topk import topk_decode_add, topk_encode, topk_threshold

SAMPLE = 4096   # elements sampled to place the candidates' threshold


class TopK(Compressor):
    code, biased, fixed_length = 4, True, True

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.name = f"topk:{fraction:g}"

    def k(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.fraction * n))) if n else 0

    def max_body(self, n: int) -> int:
        return 4 + 8 * self.k(n)

    def encode_body(self, grad: np.ndarray, out: np.ndarray) -> int:
        k = self.k(grad.shape[0])
        return topk_encode(grad, k, out, topk_threshold(grad, k, SAMPLE))

    def decode_add_body(self, body: np.ndarray, dst: np.ndarray) -> None:
        k = int(body[:4].view(np.int32)[0])
        if k != self.k(dst.shape[0]):
            from psgd.errors import PsgdError
            raise PsgdError(f"a topk frame holds {k} elements, expected {self.k(dst.shape[0])}")
        topk_decode_add(body, dst)
