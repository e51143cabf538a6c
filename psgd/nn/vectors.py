"""The one check that an array is a flat float32 vector that MPI and the kernels can use in place."""
from __future__ import annotations

import numpy as np


def check_flat(x, n: int, what: str) -> None:
    """Raise ValueError unless ``x`` is a C-contiguous float32 ndarray of shape ``(n,)``.

    ``what`` names the array in the message (e.g. ``"hogwild grad"``).
    """
    if (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.shape == (n,)
            and x.flags.c_contiguous):
        return
    got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
    if isinstance(x, np.ndarray) and not x.flags.c_contiguous:
        got += " (not contiguous)"
    raise ValueError(f"{what} must be a contiguous float32 vector of length {n}, got {got}")
