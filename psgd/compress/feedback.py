"""A worker's compressed push, shard by shard, with the error-feedback residual.

With feedback the worker encodes p = g + r and keeps r <- p - decode(encode(p))
(Seide et al. 2014; Karimireddy et al. 2019), so every part of every gradient
is sent eventually: sum of what was sent + r = sum of the gradients.
"""
from __future__ import annotations

import numpy as np

from psgd.compress.base import Compressor
from psgd.kernels.compress import add_residual


class PushEncoder:
    """Encodes a full gradient into one frame per shard (``shard_map``'s slices)."""

    def __init__(self, compressor: Compressor, shard_map, feedback: bool) -> None:
        self.compressor, self.shard_map, self.feedback = compressor, shard_map, feedback
        n = shard_map.n
        self.frames = [np.zeros(compressor.max_bytes(shard_map.size(s)), np.uint8)
                       for s in range(shard_map.n_shards)]
        self.lengths = [0] * shard_map.n_shards
        self.residual = np.zeros(n, np.float32) if feedback else None
        self._sum = np.zeros(n, np.float32) if feedback else None
        self.bytes_sent = 0

    def encode(self, grad: np.ndarray) -> list[np.ndarray]:
        """The frames of ``grad`` (float32 (n,)), valid until the next call."""
        source = grad
        if self.feedback:
            add_residual(grad, self.residual, self._sum)
            source = self._sum
        out = []
        for s, frame in enumerate(self.frames):
            part = self.shard_map.view(source, s)
            length = self.compressor.encode(part, frame)
            if self.feedback:   # r = p - decode(frame): start from p, take the decoded part off
                r = self.shard_map.view(self.residual, s)
                np.copyto(r, part)
                r *= -1
                self.compressor.decode_add(frame[:length], r)
                r *= -1
            self.lengths[s] = length
            self.bytes_sent += length
            out.append(frame[:length])
        return out
