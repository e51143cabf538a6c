"""A fast check that a flat vector holds no NaN or Inf."""
from __future__ import annotations

import numpy as np


def all_finite(x: np.ndarray) -> bool:
    """True when every value of the 1-D float array ``x`` is finite.

    ``x . x`` (one BLAS call) is finite whenever every value is; only when it is
    not (a NaN/Inf, or a huge finite value that overflowed) look element by element.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(x.dot(x)):
            return True
    return bool(np.isfinite(x).all())
