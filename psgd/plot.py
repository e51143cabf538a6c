"""`psgd plot`: loss and test accuracy against wall time and steps, and staleness histograms, as PNG."""
from __future__ import annotations

import argparse
from pathlib import Path

from psgd.run.metrics import read_log

DESCRIPTION = """Draw PNG charts from psgd JSON-lines logs (--log of `psgd train`).

One line per run: training loss and test accuracy against wall time and
against steps, and each run's staleness histogram (updates by staleness)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="+", metavar="LOG", help="JSON-lines log files")
    parser.add_argument("-o", "--output", default="psgd-plot.png", help="PNG file to write")
    parser.add_argument("--title", default=None, help="figure title")


def _label(path: str, records: list[dict]) -> str:
    config = next((r for r in records if r["kind"] == "config"), None)
    if config is None:
        return Path(path).stem
    proto = config.get("protocol", "?")
    if config.get("staleness") is not None:   # a bound the user set (ssp)
        proto += f" s={config.get('staleness')}"
    return f"{Path(path).stem} ({proto}, W={config.get('n_workers')})"


def plot_logs(paths: list[str], output: str, title: str | None = None) -> Path:
    """Render the logs at ``paths`` into one PNG at ``output``; returns its path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(p, read_log(p)) for p in paths]
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    (loss_t, loss_s, hist), (acc_t, acc_s, spare) = axes
    width = 0.8 / max(len(runs), 1)
    for k, (path, records) in enumerate(runs):
        label = _label(path, records)
        steps = [r for r in records if r["kind"] == "step"]
        evals = [r for r in records if r["kind"] == "eval"]
        if steps:
            line, = loss_t.plot([r["time"] for r in steps], [r["loss"] for r in steps], label=label)
            loss_s.plot([r["step"] for r in steps], [r["loss"] for r in steps],
                        color=line.get_color(), label=label)
        if evals:
            acc_t.plot([r["time"] for r in evals], [r["test_accuracy"] for r in evals],
                       marker="o", label=label)
            acc_s.plot([r["step"] for r in evals], [r["test_accuracy"] for r in evals],
                       marker="o", label=label)
        summary = next((r for r in records if r["kind"] == "summary"), None)
        counts = (summary or {}).get("staleness_histogram") or []
        if counts:
            hist.bar([i + k * width for i in range(len(counts))], counts, width=width,
                     alpha=0.7, label=label)
    for ax, xlabel, ylabel in [(loss_t, "wall time (s)", "training loss"),
                               (loss_s, "step (clock)", "training loss"),
                               (acc_t, "wall time (s)", "test accuracy"),
                               (acc_s, "step (clock)", "test accuracy"),
                               (hist, "staleness (clocks)", "updates")]:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    hist.set_title("staleness of applied updates")
    spare.axis("off")
    rows = []
    for path, records in runs:
        summary = next((r for r in records if r["kind"] == "summary"), {})
        acc, rate = summary.get("test_accuracy"), summary.get("samples_per_s")
        rows.append(f"{_label(path, records)}\n  final test accuracy "
                    f"{'?' if acc is None else format(acc, '.4f')}, "
                    f"{'?' if rate is None else format(rate, '.0f')} samples/s")
    spare.text(0.0, 1.0, "\n".join(rows), va="top", family="monospace", fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(output)
    if out.parent and not out.parent.exists():
        raise ValueError(f"output directory {out.parent} does not exist")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def run(args: argparse.Namespace) -> None:
    out = plot_logs(args.logs, args.output, args.title)
    print(f"wrote {out}")
