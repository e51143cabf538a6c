"""``PSGD_*`` environment variables, read with a clear error when a value does not parse."""
from __future__ import annotations

import os


def env_float(name: str, default: float) -> float:
    """``float(os.environ[name])``, or ``default`` when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from None


def env_int(name: str, default: int) -> int:
    """``int(os.environ[name])``, or ``default`` when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
