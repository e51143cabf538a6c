"""Charts without a display: matplotlib's Agg backend, and writing a figure as a PNG."""
from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported on first use: `psgd --help` stays fast)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, out: Path) -> Path:
    """Write ``fig`` as a PNG at ``out`` (its folder made if missing), then close it."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    finally:
        pyplot().close(fig)
    return out
