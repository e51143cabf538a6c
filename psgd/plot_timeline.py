"""`psgd plot --timeline`: a Gantt chart of a Chrome trace written by `psgd train --timeline`."""
from __future__ import annotations

import json
from pathlib import Path

from psgd.figure import pyplot, save_figure

COLOURS = {"compute": "tab:blue", "data": "tab:cyan", "straggle": "black", "step": "lightgrey", "lead": "tab:olive",
           "push": "tab:orange", "wait": "tab:red", "pull": "tab:green", "allreduce": "tab:purple",
           "optimizer": "tab:pink", "apply": "tab:brown", "reply": "yellowgreen",
           "snapshot": "tab:gray", "idle": "whitesmoke", "start": "gold", "finish": "gold"}


def read_trace(path: str) -> dict:
    """A psgd timeline; a clear ValueError names a file that is not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            trace = json.load(fh)
    except OSError as exc:
        raise ValueError(f"timeline {path}: cannot open ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"timeline {path}: not a Chrome trace JSON file "
                         f"(`psgd train --timeline` writes one)") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"timeline {path}: no traceEvents list (not a Chrome trace)")
    return trace


def plot_timeline(path: str, output: str | None = None, seconds: float = 2.0,
                  title: str | None = None) -> Path:
    """Draw ``seconds`` of the trace at ``path`` from its first training step, one bar row per
    rank and row (a worker's loop and its protocol's detail)."""
    from matplotlib.patches import Patch

    plt = pyplot()

    if not seconds > 0:
        raise ValueError(f"--seconds must be > 0, got {seconds}")
    trace = read_trace(path)
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    first = min((e["ts"] for e in spans if e["name"] == "compute"), default=0.0) / 1e6
    end = first + seconds
    spans = [e for e in spans if e["ts"] < end * 1e6 and e["ts"] + e["dur"] > first * 1e6]
    rows = sorted({(e["pid"], e.get("tid", 0)) for e in spans})
    fig, ax = plt.subplots(figsize=(16, 1.0 + 0.45 * max(len(rows), 1)))
    for y, (pid, tid) in enumerate(rows):
        mine = [e for e in spans if e["pid"] == pid and e.get("tid", 0) == tid]
        for kind in sorted({e["name"] for e in mine}):
            bars = [(e["ts"] / 1e6, e["dur"] / 1e6) for e in mine if e["name"] == kind]
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=COLOURS.get(kind, "black"))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{names.get(pid, pid)}{' protocol' if tid else ''}" for pid, tid in rows],
                       fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(first, end)
    ax.set_xlabel("time since the barrier before training (s)")
    seen = sorted({e["name"] for e in spans})
    ax.legend(handles=[Patch(color=COLOURS.get(k, "black"), label=k) for k in seen],
              ncol=min(len(seen), 8), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    ax.set_title(title or f"{Path(path).name}: {seconds:g} s from the first training step")
    fig.tight_layout()
    return save_figure(fig, Path(output) if output else Path(path).with_suffix(".png"))
