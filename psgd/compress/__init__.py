"""Gradient compressors for pushes: ``--compress none|fp16|qsgd:BITS|topk:FRACTION|sign|sparse``.

One module per compressor; :func:`make` parses a spec (and imports only the
compressor it names), :class:`psgd.compress.feedback.PushEncoder` encodes a
worker's gradient shard by shard with the error-feedback residual.
"""
from __future__ import annotations

from psgd.compress.base import HEADER_BYTES, Compressor
from psgd.errors import UsageError

NONE = "none"
DEFAULT_BUCKET = 512
HELP = {"none": "float32 as computed",
        "fp16": "half precision, 2 bytes per element",
        "qsgd:BITS[:max|l2]": "QSGD, BITS (1..8) bits per element: an unbiased signed level "
                              "of 2^BITS - 1 (qsgd:1: +-1), scaled by the bucket's largest "
                              "magnitude (max, the default) or its L2 norm (l2)",
        "topk:FRACTION": "the largest FRACTION (0, 1] of magnitudes as index + value",
        "sign": "one bit per element and the bucket's mean magnitude",
        "sparse": "the nonzeros as index + value where that is smaller (lossless; sparse models)"}

__all__ = ["HEADER_BYTES", "Compressor", "make", "check", "register", "NONE", "HELP"]
_REGISTERED: dict = {}   # name -> factory(arg, bucket, seed), from register()


def register(spec: str, help_text: str, factory) -> None:
    """Add a compressor from outside psgd: ``spec`` as :data:`HELP` writes it (``name`` or
    ``name:ARG``), one line of help, and ``factory(arg, bucket, seed)`` returning the
    :class:`Compressor` (ValueError for a bad ``arg``). ValueError if the name is taken."""
    name = spec.partition(":")[0]
    if name in _REGISTERED or any(k.partition(":")[0] == name for k in HELP):
        raise UsageError(f"compressor {name!r} is registered already")
    HELP[spec] = help_text
    _REGISTERED[name] = factory


def make(spec: str, bucket: int = DEFAULT_BUCKET, seed: int = 0) -> Compressor | None:
    """The compressor ``spec`` names (None for ``none``); ValueError naming what is wrong.

    ``seed`` starts qsgd's random rounding (a worker passes one of its own)."""
    if not isinstance(bucket, int) or bucket < 1:
        raise UsageError(f"--compress-bucket must be >= 1, got {bucket}")
    name, _, arg = spec.partition(":")
    if name == NONE and not arg:
        return None
    if name == "sparse" and not arg:
        from psgd.compress.sparse import Sparse
        return Sparse()
    if name == "fp16" and not arg:
        from psgd.compress.fp16 import Fp16
        return Fp16()
    if name == "sign" and not arg:
        from psgd.compress.sign import Sign
        return Sign(bucket)
    if name == "qsgd":
        from psgd.compress.qsgd import DEFAULT_SCALE, SCALES, Qsgd
        text, _, scale = arg.partition(":")
        try:
            bits = int(text)
        except ValueError:
            raise UsageError(f"--compress {spec}: qsgd takes the bits per element, "
                             f"e.g. qsgd:4") from None
        if not 1 <= bits <= 8:
            raise UsageError(f"--compress {spec}: bits must be in 1..8")
        if scale and scale not in SCALES:
            raise UsageError(f"--compress {spec}: qsgd's scale is {' or '.join(SCALES)}, "
                             f"e.g. qsgd:{bits}:{SCALES[0]}")
        return Qsgd(bits, bucket, seed, scale or DEFAULT_SCALE)
    if name == "topk":
        from psgd.compress.topk import TopK
        try:
            fraction = float(arg)
        except ValueError:
            raise UsageError(f"--compress {spec}: topk takes the fraction kept, "
                             f"e.g. topk:0.01") from None
        if not 0 < fraction <= 1:
            raise UsageError(f"--compress {spec}: the fraction must be in (0, 1]")
        return TopK(fraction)
    if name in _REGISTERED:
        return _REGISTERED[name](arg, bucket, seed)
    raise UsageError(f"--compress {spec!r} is not one of {', '.join(HELP)}")


def check(spec: str, bucket: int, feedback: str) -> None:
    """Validate ``--compress``, ``--compress-bucket`` and ``--error-feedback`` together."""
    comp = make(spec, bucket)
    if feedback not in ("auto", "on", "off"):
        raise UsageError(f"--error-feedback {feedback!r} is not auto, on or off")
    if comp is None and feedback == "on":
        raise UsageError("--error-feedback on needs a --compress other than none")


def feedback_on(spec: str, feedback: str, bucket: int = DEFAULT_BUCKET) -> bool:
    """Whether the residual is kept: ``auto`` keeps it for the biased compressors (topk, sign)."""
    comp = make(spec, bucket)
    return comp is not None and (feedback == "on" or feedback == "auto" and comp.biased)
