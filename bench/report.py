"""REPORT.md and PNG charts from the results dictionary that bench/run_all.py collects."""
from __future__ import annotations

from pathlib import Path

TIME_KEYS = ("compute_s", "push_s", "pull_s", "wait_s", "allreduce_s")


def _f(value, fmt: str = ".0f", none: str = "-") -> str:
    return none if value is None else format(value, fmt)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _error_line(section) -> str:
    if not isinstance(section, dict):
        return ""
    if "error" in section:
        return f"**Not measured:** {section['error']}\n"
    return _load_line(section)


def _load_line(section) -> str:
    notes = []
    if section.get("load_average"):
        before, after = section["load_average"]
        notes.append(f"Load average (1, 5, 15 min) before: {before}; after: {after}.")
    if section.get("kept_from"):
        notes.append(f"Measured in the run of {section['kept_from']} (kept with --keep).")
    return " ".join(notes) + "\n" if notes else ""


def _bytes(n: int) -> str:
    for unit, scale in (("MB", 2 ** 20), ("KB", 2 ** 10)):
        if n >= scale:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _one(row) -> str:
    return ("psgd train, one allreduce rank" if row["protocol"] == "allreduce"
            else f"train_serial, {row['blas_threads']} BLAS thread(s)")


def summary_section(proto, scal) -> str:
    """The headline facts, computed from the tables (so they cannot drift from them)."""
    target = proto["config"]["target_accuracy"]
    ok = [r for r in proto["runs"] if "error" not in r]
    base = [r for r in proto["baseline"] if "error" not in r]
    lines = []
    timed = sorted((r for r in ok if r.get("time_to_target_s") is not None),
                   key=lambda r: r["time_to_target_s"])
    if timed:
        best = timed[0]
        lines.append(f"Fastest distributed run to test accuracy {target}: **{best['name']} with "
                     f"W={best['workers']}**, {best['time_to_target_s']:.1f} s.")
    missed = [f"{r['name']} W={r['workers']}" for r in ok if r.get("time_to_target_s") is None]
    if missed:
        lines.append(f"Runs that never reached {target}: {', '.join(missed)}.")
    if scal:      # psgd train with one allreduce rank is a single process too (COST: the best one)
        base = base + [r for r in scal["rows"] if r.get("protocol") == "allreduce"
                       and r.get("ranks") == 1 and "error" not in r]
    if base:
        b_tt = [r for r in base if r.get("time_to_target_s") is not None]
        b_best = max(base, key=lambda r: r["samples_per_s"])
        d_best = max(ok, key=lambda r: r["samples_per_s"]) if ok else None
        if b_tt:
            bt = min(b_tt, key=lambda r: r["time_to_target_s"])
            verdict = ("beats" if timed and timed[0]["time_to_target_s"] < bt["time_to_target_s"]
                       else "does not beat")
            lines.append(f"COST: the best single process ({_one(bt)}) reaches "
                         f"{target} in {bt['time_to_target_s']:.1f} s; the best distributed run "
                         f"**{verdict}** it"
                         + (f" ({timed[0]['time_to_target_s'] / bt['time_to_target_s']:.2f}x its time)."
                            if timed else "."))
        if d_best:
            lines.append(f"Throughput: best distributed {d_best['samples_per_s']:.0f} samples/s "
                         f"({d_best['name']}, W={d_best['workers']}) against "
                         f"{b_best['samples_per_s']:.0f} samples/s for the best single process "
                         f"({_one(b_best)}) "
                         f"({d_best['samples_per_s'] / b_best['samples_per_s']:.2f}x).")
    if scal:
        eff = [r for r in scal["rows"] if "per_core_efficiency" in r and not r["oversubscribed"]
               and r["workers"] > 1]
        if eff:
            lines.append("Per-core efficiency without oversubscription: " + ", ".join(
                f"{r['name']} W={r['workers']} {r['per_core_efficiency']:.2f}" for r in eff) + ".")
    return "## Summary\n\n" + "\n".join(f"- {x}" for x in lines) + "\n"


def kernels_section(res) -> str:
    out = ["## Kernels: psgd (numba) beside PyTorch CPU, one thread\n",
           "Forward + backward + SGD step, batch "
           f"{res.get('batch', '?')}, median of {res.get('repeats', '?')} repeats "
           f"(torch {res.get('torch_version')}). Ratio > 1: psgd is faster.\n", _error_line(res)]
    rows = []
    for spec, r in (res.get("models") or {}).items():
        rows.append([spec, _f(r["psgd_samples_per_s"]), _f(r["torch_samples_per_s"]),
                     _f(r["ratio_psgd_over_torch"], ".2f"), _f(r["psgd_samples_per_cpu_s"]),
                     _f(r["torch_samples_per_cpu_s"]), _f(r["ratio_psgd_over_torch_cpu"], ".2f")])
    if rows:
        out.append(_table(["model", "psgd samples/s", "torch samples/s", "psgd/torch",
                           "psgd samples/CPU-s", "torch samples/CPU-s", "psgd/torch (CPU)"], rows))
    return "\n".join(out)


def allreduce_section(res) -> str:
    from bench_allreduce import _target
    out = ["## All-reduce: psgd beside MPI_Allreduce (MPICH)\n",
           "float32 sum; bus bandwidth = 2(N-1)/N x bytes / time; a sample is ~10 ms of "
           "back-to-back calls on one buffer (OSU-style), the table shows the median sample of "
           "the slowest rank. `psgd`: `allreduce` as training calls it (`algo`: what it took; "
           "on one node, the shared-memory window up to 4 MB); `p2p`: the same kept to messages "
           "(recursive doubling below 256 KB, the ring from there), what runs across nodes. "
           "Ratios > 1: psgd is faster. Targets (issue #9): latency within 1.5x of MPI's at 4 KB, "
           "at least 1.1x its bus bandwidth from 1 MB.\n", _error_line(res)]
    rows = [[r["ranks"], _bytes(r["bytes"]), r["algorithm"], _f(r["psgd_s"] * 1e6, ".1f"),
             _f(r["p2p_s"] * 1e6, ".1f"), _f(r["mpi_s"] * 1e6, ".1f"),
             _f(r["psgd_busbw_GBs"], ".2f"), _f(r["mpi_busbw_GBs"], ".2f"),
             _f(r["mpi_s"] / r["psgd_s"], ".2f"), _target(r),
             _f(r["mpi_s"] / r["p2p_s"], ".2f"), _target(r, "p2p")] for r in res.get("rows", [])]
    if rows:
        out.append(_table(["ranks", "size", "algo", "psgd us", "p2p us", "MPI us", "psgd GB/s",
                           "MPI GB/s", "MPI time / psgd time", "target",
                           "MPI time / p2p time", "target (p2p)"], rows))
    return "\n".join(out)


def ps_section(res) -> str:
    out = ["## Parameter server: push + pull throughput beside raw MPI bandwidth\n",
           f"{res.get('n_params', '?')} float32 per push and per pull, 2 workers, no compute, "
           f"{res.get('steps', '?')} steps. Raw: Isend/Irecv ping-pong of the same size between two "
           "ranks, both waiting in MPICH's Waitall (which busy-polls a core each; psgd's ranks sleep "
           "between polls). The raw ping-pong runs before the first case and after every case; a "
           "case's ratio is against the faster of the two runs around it. Target (issue #4): at "
           "least 0.5 of raw. Server buffers: the shard-length float32 buffers a server holds "
           "(versions, receive/sum, optimizer state), the same whatever the number of workers.\n",
           _error_line(res)]
    raws = res.get("raw_runs_MB_s", [])
    if raws:
        out.append(f"Raw MPI: {min(raws):.0f}-{max(raws):.0f} MB/s over {len(raws)} runs. Each "
                   f"case ran {res.get('repeat', 1)} time(s); the row is its run with the median "
                   f"ratio, and the range is over all its runs.\n")
    rows = [[r["case"], _f(r["MB_s"]), _f(r["updates_s"], ".1f"), _f(r.get("raw_MB_s")),
             _f(r["ratio_to_raw"], ".2f"),
             "-".join(f"{x:.2f}" for x in (min(r.get("ratio_runs", [r["ratio_to_raw"]])),
                                           max(r.get("ratio_runs", [r["ratio_to_raw"]])))),
             ", ".join(f"{x:.2f}" for x in r["server_cpu_fraction"]),
             ", ".join(f"{x:.1f}" for x in r.get("server_buffers_mb", []))]
            for r in res.get("ps", [])]
    if rows:
        out.append(_table(["case", "MB/s", "updates/s", "raw MB/s around it", "of raw",
                           "of raw, all runs", "server CPU / wall", "server buffers MB"], rows))
    return "\n".join(out)


def hogwild_section(res) -> str:
    out = ["## Hogwild (one-sided MPI) beside ASP (server-driven)\n",
           "Updates/s with no compute, 2 workers, 1 server. The point of hogwild is a server "
           "that uses no CPU; ASP's row is from the PS benchmark above (same vector size when "
           "both use their defaults).\n", _error_line(res)]
    rows = [[f"hogwild ({r['window']} window)", r["n_params"], _f(r["updates_per_s"], ".1f"),
             _f(r["push_ms"], ".3f"), _f(r["pull_ms"], ".3f"),
             _f(r["server_cpu_fraction"], ".3f"), _f(r["mean_staleness"], ".2f")]
            for r in res.get("results", [])]
    asp = res.get("asp")
    if asp:
        rows.append([asp["case"], res.get("asp_n_params", "?"), _f(asp["updates_s"], ".1f"), "-", "-",
                     ", ".join(f"{x:.3f}" for x in asp["server_cpu_fraction"]), "-"])
    if rows:
        out.append(_table(["mode", "params", "updates/s", "push ms", "pull ms",
                           "server CPU / wall", "mean staleness"], rows))
    return "\n".join(out)


def _stale(row) -> str:
    hist = row.get("staleness_histogram") or []
    if not hist:
        return "-"
    n = sum(hist)
    head = " ".join(f"{c / n:.2f}" for c in hist[:6]) + (" ..." if len(hist) > 6 else "")
    return f"mean {row['staleness_mean']:.2f}, max {row['staleness_max']} [{head}]"


def _split(row) -> str:
    wt = row.get("worker_time") or {}
    total = sum(wt.get(k, 0.0) for k in TIME_KEYS)
    if not total:
        return "-"
    return " / ".join(f"{100 * wt.get(k, 0.0) / total:.0f}" for k in TIME_KEYS)


def protocols_section(res) -> str:
    cfg = res["config"]
    target = cfg["target_accuracy"]
    rows_all = res["baseline"] + res["runs"]
    reached = sum(1 for r in res["runs"] if r.get("time_to_target_s") is not None)
    out = ["## Protocol comparison\n",
           f"Model `{cfg['model']}`, dataset `{cfg['dataset']}`, optimizer {cfg['optimizer']} "
           f"lr {cfg['lr']}, batch {cfg['batch_size']} per worker, {cfg['epochs']} epoch(s) of "
           f"the training set in total (each worker covers its own slice), seed {cfg['seed']}. "
           f"Test accuracy is measured on the first {cfg['eval_samples']} test samples every "
           f"~{cfg['eval_every_samples']} global samples. **Target accuracy: {target}** "
           f"(reached by {reached} of {len(res['runs'])} distributed runs). Every rank runs with "
           "one BLAS thread unless the row says otherwise. Time split: % of worker time in "
           "compute / push / pull / wait / allreduce. Staleness: mean, max and the fraction of "
           "updates at staleness 0, 1, 2, ...\n", _load_line(res)]
    rows = []
    for r in rows_all:
        if "error" in r:
            rows.append([r["name"], r.get("workers", "?"), r.get("ranks", "?"), "failed: " + r["error"][:80],
                         "", "", "", "", "", ""])
            continue
        over = " (oversubscribed)" if r.get("oversubscribed") else ""
        threads = ("" if r.get("blas_threads") == "1" or "BLAS" in r["name"]
                   else f", {r.get('blas_threads')} BLAS threads")
        rows.append([r["name"] + threads, r["workers"], f"{r['ranks']}{over}", _f(r["samples_per_s"]),
                     _f(r.get("time_to_target_s"), ".1f"), _f(r["final_accuracy"], ".3f"),
                     _f(r["wall_s"], ".1f"), _stale(r), _split(r),
                     ", ".join(f"{x:.2f}" for x in r.get("server_cpu_fraction") or []) or "-"])
    out.append(_table(["run", "W", "ranks", "samples/s", f"s to {target}", "final acc", "wall s",
                       "staleness", "time split %", "server CPU"], rows))
    out.append("![test accuracy against wall time](accuracy_vs_time.png)\n")
    out.append("![worker time split](time_split.png)\n")
    return "\n".join(out)


def scaling_section(res) -> str:
    single = res.get("single_samples_per_s")
    out = ["## Scaling: throughput against the number of workers\n",
           f"The machine has {res['cores']} cores: every row with more ranks than cores is "
           "**oversubscribed** (ranks share cores; a parameter server is a rank too, though it "
           "sleeps while idle). Per-core efficiency = samples/s / (min(W, cores) x single-process "
           f"samples/s), against the fastest one-process run, {res.get('single_reference')}: "
           f"{_f(single)} samples/s.\n",
           _load_line(res)]
    rows = []
    for r in res["rows"]:
        if "error" in r:
            rows.append([r["name"], r["workers"], r.get("ranks", "?"), "failed: " + r["error"][:60], "", "", ""])
            continue
        rows.append([r["name"], r["workers"], r["ranks"], _f(r["samples_per_s"]),
                     _f(r.get("speedup"), ".2f"), _f(r.get("per_core_efficiency"), ".2f"),
                     "yes" if r["oversubscribed"] else "no"])
    out.append(_table(["protocol", "W", "ranks", "samples/s", "vs single process",
                       "per-core efficiency", "oversubscribed"], rows))
    out.append("![scaling](scaling.png)\n")
    return "\n".join(out)


def machine_section(m: dict) -> str:
    rows = [[k, v] for k, v in m.items()]
    return "## Machine\n\n" + _table(["", ""], rows)


def write_report(results: dict, out: Path) -> Path:
    """Write ``out/REPORT.md`` (and the charts it links) from run_all's results."""
    make_plots(results, out)
    parts = [f"# psgd benchmark report{' (quick mode: tiny sizes, numbers not meaningful)' if results['quick'] else ''}\n",
             f"Generated {results['generated']} in {results['total_s']:.0f} s by `{results['command']}`. "
             f"Load average before the run: {results['load_before']}; after: {results['load_after']}.\n",
             "## Reproduce\n", "```\n" + "\n".join(results["reproduce"]) + "\n```\n",
             machine_section(results["machine"])]
    sections = results["sections"]
    if "protocols" in sections:
        parts.insert(2, summary_section(sections["protocols"], sections.get("scaling")))
        parts.append(protocols_section(sections["protocols"]))
    if "scaling" in sections:
        parts.append(scaling_section(sections["scaling"]))
    for key, fn in (("kernels", kernels_section), ("allreduce", allreduce_section),
                    ("ps", ps_section), ("hogwild", hogwild_section)):
        if key in sections:
            parts.append(fn(sections[key]))
    parts.append("## Caveats\n\n" + "\n".join(f"- {c}" for c in results["caveats"]) + "\n")
    path = out / "REPORT.md"
    path.write_text("\n".join(parts))
    return path


def _save(fig, path: Path) -> Path:
    """Lay out, write (80 dpi) and close one chart."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def make_plots(results: dict, out: Path) -> list[Path]:
    """accuracy_vs_time.png, time_split.png and scaling.png under ``out``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    proto = results["sections"].get("protocols")
    if proto:
        runs = [r for r in proto["baseline"] + proto["runs"] if "error" not in r]
        worker_counts = sorted({r["workers"] for r in proto["runs"]})
        fig, axes = plt.subplots(1, len(worker_counts) or 1, figsize=(7 * max(len(worker_counts), 1), 5),
                                 squeeze=False)
        for ax, w in zip(axes[0], worker_counts or [1]):
            for r in runs:
                if r["workers"] == w or r["protocol"] == "local":
                    t, acc = zip(*r["evals"]) if r["evals"] else ((), ())
                    style = "-" if r["protocol"] != "local" else (
                        "k--" if r.get("blas_threads") == "1" else "k:")
                    label = r["name"] + ("" if r.get("blas_threads") in ("1", None) or "BLAS" in r["name"] else
                                         f" ({r['blas_threads']} BLAS thr)")
                    ax.plot(t, acc, style, marker=".", label=label, alpha=0.85)
            ax.axhline(proto["config"]["target_accuracy"], color="grey", lw=0.8, ls=":")
            ax.set(title=f"W = {w} workers (dashed: single process)", xlabel="wall time (s)",
                   ylabel="test accuracy")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        paths.append(_save(fig, out / "accuracy_vs_time.png"))

        labels = [f"{r['name']} W={r['workers']}" if r["protocol"] != "local" else
                  f"single ({r['blas_threads']} thr)" for r in runs]
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(runs)), 4.5))
        bottom = [0.0] * len(runs)
        for key in TIME_KEYS:
            vals = [(r.get("worker_time") or {}).get(key, 0.0) for r in runs]
            ax.bar(range(len(runs)), vals, bottom=bottom, label=key.replace("_s", ""))
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_xticks(range(len(runs)), labels, rotation=60, ha="right", fontsize=8)
        ax.set(ylabel="seconds per worker (mean)", title="where worker time goes")
        ax.legend(fontsize=8)
        paths.append(_save(fig, out / "time_split.png"))
    scal = results["sections"].get("scaling")
    if scal:
        fig, ax = plt.subplots(figsize=(6.5, 4.5))
        for name in dict.fromkeys(r["name"] for r in scal["rows"]):
            pts = [(r["workers"], r["samples_per_s"]) for r in scal["rows"]
                   if r["name"] == name and "error" not in r]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        if scal.get("single_samples_per_s"):
            s = scal["single_samples_per_s"]
            ws = sorted({r["workers"] for r in scal["rows"]})
            ax.plot(ws, [s * min(w, scal["cores"]) for w in ws], "k:", label="ideal (min(W, cores) x single)")
            ax.axhline(s, color="grey", ls="--", lw=0.8, label="fastest single process")
        w_max = max([r["workers"] for r in scal["rows"]] + [scal["cores"]])
        if w_max > scal["cores"]:
            ax.axvspan(scal["cores"] + 0.5, w_max + 0.3, color="red", alpha=0.07,
                       label="more worker ranks than cores")
        ax.set_xticks(sorted({r["workers"] for r in scal["rows"]}))
        ax.set(xlabel="workers W", ylabel="samples/s", title=f"throughput ({scal['cores']} cores)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(_save(fig, out / "scaling.png"))
    return paths
