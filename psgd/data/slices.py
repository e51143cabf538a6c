"""Contiguous near-equal slices of a split's rows, one per worker."""
from __future__ import annotations


def slice_bounds(n: int, part: int, n_parts: int) -> tuple[int, int]:
    """``[lo, hi)`` of part ``part`` of ``n`` rows cut into ``n_parts`` near-equal contiguous slices.

    The first ``n % n_parts`` slices are one row longer than the rest.
    """
    if n_parts < 1:
        raise ValueError(f"number of workers must be >= 1, got {n_parts}")
    if not 0 <= part < n_parts:
        raise ValueError(f"worker {part} is outside [0, {n_parts})")
    base, extra = divmod(int(n), int(n_parts))
    lo = part * base + min(part, extra)
    return lo, lo + base + (1 if part < extra else 0)
