"""The compressor interface and the frame of an encoded push: an 8-byte header, then the body."""
from __future__ import annotations

import numpy as np

from psgd.errors import PsgdError

HEADER_BYTES = 8   # uint32 n (elements), uint32 compressor code


class Compressor:
    """Encode a float32 slice into bytes; decode bytes and add them into a float32 slice.

    Subclasses set ``name``, ``code`` (the id in every frame), ``biased``
    (error feedback on by default), ``summable`` (a running sum may be re-encoded
    hop by hop, as the all-reduce's ring does), ``momentum_gain`` (with error
    feedback under bsp, ``--momentum-correction auto`` steps at the momentum's
    gain, :mod:`psgd.compress.gain`, instead of pushing velocities) and implement :meth:`max_body` /
    :meth:`encode_body` / :meth:`decode_add_body`.
    """

    name = "none"
    code = 0
    biased = False
    summable = False
    fixed_length = False
    momentum_gain = False

    def max_body(self, n: int) -> int:
        """Bytes the body of an ``n``-element slice may take."""
        raise NotImplementedError

    def encode_body(self, grad: np.ndarray, out: np.ndarray) -> int:
        """Write ``grad``'s encoding into ``out`` (uint8); return the bytes written."""
        raise NotImplementedError

    def decode_add_body(self, body: np.ndarray, dst: np.ndarray) -> None:
        """``dst += decode(body)`` (``dst`` float32 of the encoded length)."""
        raise NotImplementedError

    # the frame ------------------------------------------------------------

    def max_bytes(self, n: int) -> int:
        return HEADER_BYTES + self.max_body(n)

    def encode(self, grad: np.ndarray, out: np.ndarray) -> int:
        """Frame and encode ``grad`` (float32 (n,)) into ``out`` (uint8); return its length."""
        out[:HEADER_BYTES].view(np.uint32)[:] = (grad.shape[0], self.code)
        return HEADER_BYTES + self.encode_body(grad, out[HEADER_BYTES:])

    def decode_add(self, frame: np.ndarray, dst: np.ndarray, where: str = "a push") -> None:
        """``dst += decode(frame)``, after checking the frame is this compressor's, for ``dst``."""
        if frame.shape[0] < HEADER_BYTES:
            raise PsgdError(f"{where}: a compressed frame of {frame.shape[0]} bytes has no header")
        n, code = (int(v) for v in frame[:HEADER_BYTES].view(np.uint32))
        if code != self.code or n != dst.shape[0]:
            raise PsgdError(f"{where}: the frame holds {n} elements coded {code}, expected "
                            f"{dst.shape[0]} coded {self.code} ({self.name})")
        self.decode_add_body(frame[HEADER_BYTES:], dst)
