"""sparse: a slice's nonzeros as index + value when that is smaller than the slice, lossless."""
from __future__ import annotations

import numpy as np

from psgd.compress.base import Compressor
from psgd.kernels.sparse import nonzero_decode_add, nonzero_encode


class Sparse(Compressor):
    name, code, biased = "sparse", 5, False

    def max_body(self, n: int) -> int:
        return 4 + 4 * n

    def encode_body(self, grad: np.ndarray, out: np.ndarray) -> int:
        return nonzero_encode(grad, out)

    def decode_add_body(self, body: np.ndarray, dst: np.ndarray) -> None:
        nonzero_decode_add(body, dst)
