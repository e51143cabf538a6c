"""`psgd plot`: loss and test accuracy against wall time and steps, and staleness histograms, as PNG."""
from __future__ import annotations

import argparse
from pathlib import Path

from psgd.figure import pyplot, save_figure
from psgd.run.metrics import read_log

DESCRIPTION = """Draw PNG charts from psgd JSON-lines logs (--log of `psgd train`).

One line per run: training loss and test accuracy against wall time and
against steps, and each run's staleness histogram (updates by staleness, in
clocks for the parameter-server protocols and in updates for hogwild). Wall
time counts from the moment the lead worker opened the log; its first steps
include numba's compilation of the kernels. A resumed run's log holds every
attempt: their times are laid end to end, a dotted line where one resumed
(the time between attempts is not counted). The PNG goes beside the first log
(LOG.png) unless -o names it. Runs with --staleness auto also show the bound in
force over time; gossip and adpsgd runs, their consensus distance (the mean
squared distance of the workers' models from their mean) against steps; runs
with --compress, the bytes sent per worker per step and the compression ratio
against steps (beside them, every other run's bytes sent).

With --tensorboard LOG... DIR it writes the logs as TensorBoard event files
instead, one run per log in DIR/<log name> (`tensorboard --logdir DIR`).

With --timeline TRACE (the --timeline file of `psgd train`) it draws a Gantt
chart of every rank's spans over --seconds from the first training step
instead (TRACE.png)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("logs", nargs="*", metavar="LOG", help="JSON-lines log files")
    parser.add_argument("-o", "--output", default=None, metavar="PNG",
                        help="PNG file to write (default: the first LOG, or TRACE, with the "
                             "suffix .png)")
    parser.add_argument("--timeline", metavar="TRACE",
                        help="draw this Chrome trace (`psgd train --timeline`) as a Gantt chart")
    parser.add_argument("--tensorboard", action="store_true",
                        help="LOG... DIR: write the logs as TensorBoard event files into DIR "
                             "(one subdirectory per log; needs tensorboardX)")
    parser.add_argument("--seconds", type=float, default=2.0, metavar="S",
                        help="with --timeline: S seconds from the first training step (default 2)")
    parser.add_argument("--title", default=None,
                        help="figure title (default: the model, and the run's settings for one log)")


def _config(records: list[dict]) -> dict:
    return next((r for r in records if r["kind"] == "config"), {})


def _summary(records: list[dict]) -> dict:
    return next((r for r in records if r["kind"] == "summary"), {})


def _label(path: str, records: list[dict]) -> str:
    """``ssp (s=2, W=2)`` for runs/ssp.jsonl; the protocol is named when the file name does not."""
    config, stem = _config(records), Path(path).stem
    if not config:
        return stem
    proto = config.get("protocol", "?")
    setting = "" if proto in stem else proto
    if config.get("staleness") is not None:   # a bound the user set (ssp)
        setting = f"{setting} s={config['staleness']}".strip()
    parts = [p for p in (setting, f"W={config.get('n_workers', '?')}") if p]
    return f"{stem} ({', '.join(parts)})"


def _title(runs: list[tuple[str, list[dict]]]) -> str:
    configs = [_config(r) for _, r in runs]
    models = sorted({c.get("model", "?") for c in configs})
    if len(runs) == 1 and configs[0]:
        c = configs[0]
        return (f"{c.get('model', '?')}: {c.get('protocol', '?')}, {c.get('n_servers', '?')} "
                f"server(s) + {c.get('n_workers', '?')} worker(s), {c.get('optimizer', '?')} "
                f"lr {c.get('lr', '?')}, batch {c.get('batch_size', '?')}")
    return f"{', '.join(models)}: {len(runs)} runs"


def _one_clock(records: list[dict]) -> tuple[list[dict], list[float]]:
    """Records with the times of each resumed attempt (a later ``config`` record) carried on
    from where the previous attempt's stopped, and the times where attempts begin."""
    out, offset, last, resumes = [], 0.0, 0.0, []
    for r in records:
        if r["kind"] == "config" and out:
            offset = last
            resumes.append(offset)
        last = r.get("time", 0.0) + offset
        out.append({**r, "time": last})
    return out, resumes


def default_output(logs: list[str]) -> Path:
    """Where the PNG goes without -o: beside the first log."""
    return Path(logs[0]).with_suffix(".png")


def draw(paths: list[str], title: str | None = None):
    """The figure for the logs at ``paths`` (a matplotlib Figure; the caller saves or closes it)."""
    plt = pyplot()
    runs, resumed_at = [], {}
    for p in paths:
        records, resumed_at[p] = _one_clock(read_log(p))
        runs.append((p, records))
    decentralized = any(_consensus(records) for _, records in runs)
    compressed = any(_ratios(records) for _, records in runs)
    cols = 3 + decentralized + compressed
    fig = plt.figure(figsize=(16 + 5 * (cols - 3), 9))
    grid = fig.add_gridspec(2, cols)
    loss_t, loss_s = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    acc_t, acc_s = fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[1, 1])
    for path, records in runs:
        label = _label(path, records)
        steps = [r for r in records if r["kind"] == "step"]
        evals = [r for r in records if r["kind"] == "eval"]
        if steps:
            line, = loss_t.plot([r["time"] for r in steps], [r["loss"] for r in steps], label=label)
            loss_s.plot([r["step"] for r in steps], [r["loss"] for r in steps],
                        color=line.get_color(), label=label)
            for t in resumed_at[path]:
                loss_t.axvline(t, color=line.get_color(), linestyle=":", linewidth=1)
        if evals:
            acc_t.plot([r["time"] for r in evals], [r["test_accuracy"] for r in evals],
                       marker="o", label=label)
            acc_s.plot([r["step"] for r in evals], [r["test_accuracy"] for r in evals],
                       marker="o", label=label)
    hists = _histograms(fig, grid[0, 2], runs)
    consensus = [_plot_consensus(fig.add_subplot(grid[0, 3]), runs)] if decentralized else []
    traffic = _plot_traffic(fig.add_subplot(grid[0, cols - 1]),
                            fig.add_subplot(grid[1, cols - 1]), runs) if compressed else []
    for ax, xlabel, ylabel in [*traffic, (loss_t, "wall time (s)", "training loss"),
                               (loss_s, "step (clock)", "training loss"),
                               (acc_t, "wall time (s)", "test accuracy"),
                               (acc_s, "step (clock)", "test accuracy"),
                               *[(ax, "step (clock)", "consensus distance") for ax in consensus],
                               *[(h, f"staleness ({unit})", "updates") for unit, h in hists.items()]]:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    spare = fig.add_subplot(grid[1, 2:cols - compressed])
    spare.axis("off")
    spare.text(0.0, 1.0, _summary_text(runs), va="top", family="monospace", fontsize=8)
    _plot_bounds(spare, runs)
    fig.suptitle(title if title is not None else _title(runs))
    fig.tight_layout()
    return fig


def _histograms(fig, cell, runs: list[tuple[str, list[dict]]]) -> dict:
    """One staleness histogram per unit (clocks, hogwild's updates) in ``cell``, bars grouped
    around whole-number ticks; returns unit -> axes."""
    from matplotlib.ticker import MaxNLocator

    by_unit: dict[str, list] = {}
    for path, records in runs:
        summary = _summary(records)
        if summary.get("staleness_histogram"):
            by_unit.setdefault(summary.get("staleness_unit", "clocks"), []).append(
                (_label(path, records), summary["staleness_histogram"]))
    cells = cell.subgridspec(max(len(by_unit), 1), 1, hspace=0.6)
    hists = {}
    for i, unit in enumerate(by_unit or {"clocks": []}):
        ax = hists[unit] = fig.add_subplot(cells[i, 0])
        group = by_unit.get(unit, [])
        width = 0.8 / max(len(group), 1)
        for k, (label, counts) in enumerate(group):
            offset = (k - (len(group) - 1) / 2) * width
            ax.bar([j + offset for j in range(len(counts))], counts, width=width, alpha=0.7,
                   label=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"staleness of applied updates ({unit})", fontsize=10)
    return hists


def _consensus(records: list[dict]) -> list[dict]:
    """The step records that carry the consensus distance (gossip, adpsgd)."""
    return [r for r in records if r["kind"] == "step"
            and isinstance(r.get("consensus_distance"), (int, float))]   # not "nan"


def _plot_consensus(ax, runs: list[tuple[str, list[dict]]]):
    """Each decentralized run's consensus distance against step, on a log scale; returns ``ax``."""
    for path, records in runs:
        steps = _consensus(records)
        if steps:
            ax.plot([r["step"] for r in steps], [r["consensus_distance"] for r in steps],
                    label=_label(path, records))
    ax.set_yscale("log")
    ax.set_title("consensus distance: mean over workers of ||x_i - x_mean||^2", fontsize=10)
    return ax


def _ratios(records: list[dict]) -> list[dict]:
    """The step records of a compressed run (they carry the compression ratio)."""
    return [r for r in records if r["kind"] == "step"
            and isinstance(r.get("compression_ratio"), (int, float))]


def _plot_traffic(sent, ratio, runs: list[tuple[str, list[dict]]]) -> list[tuple]:
    """Bytes sent per worker per step (every run that logs them) on ``sent``, and each
    compressed run's compression ratio on ``ratio``, against step; returns the axes' labels."""
    for path, records in runs:
        steps = [r for r in records if r["kind"] == "step"
                 and isinstance(r.get("push_bytes_per_step"), (int, float))]
        if not steps:
            continue
        line, = sent.plot([r["step"] for r in steps], [r["push_bytes_per_step"] for r in steps],
                          label=_label(path, records))
        coded = _ratios(records)
        if coded:
            ratio.plot([r["step"] for r in coded], [r["compression_ratio"] for r in coded],
                       color=line.get_color(), label=_label(path, records))
    sent.set_yscale("log")
    sent.set_title("bytes sent per worker per step", fontsize=10)
    ratio.set_title("compression ratio: float32's bytes / bytes sent", fontsize=10)
    return [(sent, "step (clock)", "bytes per worker per step"),
            (ratio, "step (clock)", "compression ratio (x)")]


def _summary_text(runs: list[tuple[str, list[dict]]]) -> str:
    rows = []
    for path, records in runs:
        summary = _summary(records)
        acc, rate = summary.get("test_accuracy"), summary.get("samples_per_s")
        first = next((r["time"] for r in records if r["kind"] == "step"), None)
        rows.append(f"{_label(path, records)}\n  final test accuracy "
                    f"{'?' if acc is None else format(acc, '.4f')}, "
                    f"{'?' if rate is None else format(rate, '.0f')} samples/s"
                    + ("" if first is None else f"\n  first logged step at {first:.1f} s "
                                                f"(includes kernel compilation)")
                    + ("" if "push_bytes" not in summary else
                       f"\n  pushes of {summary['push_bytes']:.0f} bytes "
                       f"({summary['compression_ratio']:.1f}x fewer than float32)"))
    return "\n".join(rows)


def plot_logs(paths: list[str], output: str | None = None, title: str | None = None) -> Path:
    """Render the logs at ``paths`` into one PNG (default: beside the first log); returns its path."""
    return save_figure(draw(paths, title), Path(output) if output else default_output(paths))


def _plot_bounds(spare, runs) -> None:
    """--staleness auto: the bound in force against wall time, below the runs' text."""
    bounds = [(path, records, [r for r in records if r["kind"] == "step"
                               and r.get("staleness_bound") is not None]) for path, records in runs]
    bounds = [b for b in bounds if b[2]]
    if not bounds:
        return
    ax = spare.inset_axes([0.12, 0.08, 0.85, 0.4])
    for path, records, steps in bounds:
        ax.step([r["time"] for r in steps], [r["staleness_bound"] for r in steps], where="post",
                label=_label(path, records))
    ax.set_xlabel("wall time (s)", fontsize=8)
    ax.set_ylabel("staleness bound", fontsize=8)
    ax.set_title("--staleness auto: the bound in force", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)


def run(args: argparse.Namespace) -> None:
    if args.tensorboard:
        if args.timeline or len(args.logs) < 2:
            raise ValueError("plot --tensorboard: give LOG... DIR (one or more logs, then the "
                             "directory for the event files)")
        from psgd.plot_tensorboard import convert
        for path in convert(args.logs[:-1], args.logs[-1]):
            print(f"wrote {path}")
        return
    if args.timeline:
        if args.logs:
            raise ValueError("plot: give LOG files or --timeline TRACE, not both")
        from psgd.plot_timeline import plot_timeline
        out = plot_timeline(args.timeline, args.output, args.seconds, args.title)
    elif args.logs:
        out = plot_logs(args.logs, args.output, args.title)
    else:
        raise ValueError("plot: give one or more LOG files, or --timeline TRACE")
    print(f"wrote {out}")
