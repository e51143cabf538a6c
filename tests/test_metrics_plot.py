"""JSON-lines metrics: written records read back; `psgd plot` draws a PNG from them."""
import json
import subprocess
import sys

import numpy as np
import pytest

from psgd.plot import plot_logs
from psgd.run.metrics import MetricsLog, read_log


def write_run(path, protocol, hist):
    log = MetricsLog(path)
    log.write("config", protocol=protocol, staleness=2, n_workers=2)
    for step in range(1, 6):
        log.write("step", step=step * 10, loss=2.0 / step, samples_per_s=100.0)
        log.write("eval", step=step * 10, test_loss=2.0 / step, test_accuracy=0.1 * step)
    log.write("summary", test_accuracy=0.5, samples_per_s=np.float32(99.5),
              staleness_histogram=np.array(hist), loss=float("nan"), push_bytes=1010.0,
              compression_ratio=7.9)
    log.close()


def test_records_round_trip(tmp_path):
    path = tmp_path / "run.jsonl"
    write_run(path, "ssp", [5, 3, 1])
    records = read_log(path)
    assert [r["kind"] for r in records][:3] == ["config", "step", "eval"]
    summary = records[-1]
    assert summary["staleness_histogram"] == [5, 3, 1]
    assert summary["samples_per_s"] == pytest.approx(99.5)
    assert summary["loss"] == "nan"  # non-finite floats stay valid JSON
    for line in path.read_text().splitlines():
        json.loads(line)


def test_plot_writes_png(tmp_path):
    logs = []
    for proto, hist in (("ssp", [5, 3, 1]), ("asp", [2, 2, 2, 2])):
        logs.append(tmp_path / f"{proto}.jsonl")
        write_run(logs[-1], proto, hist)
    out = tmp_path / "out.png"
    plot_logs([str(p) for p in logs], str(out), title="t")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000


def test_plot_draws_the_bound_of_staleness_auto(tmp_path):
    path = tmp_path / "auto.jsonl"
    log = MetricsLog(path)
    log.write("config", protocol="ssp", staleness="auto", n_workers=2)
    for step, bound in ((10, 2), (20, 5), (30, 3)):
        log.write("step", step=step, loss=1.0, samples_per_s=1.0, staleness_bound=bound)
    log.close()
    plain, auto = tmp_path / "plain.png", tmp_path / "auto.png"
    write_run(tmp_path / "ssp.jsonl", "ssp", [1])
    plot_logs([str(tmp_path / "ssp.jsonl")], str(plain))
    plot_logs([str(tmp_path / "ssp.jsonl"), str(path)], str(auto))
    import matplotlib.image
    # the bound's panel fills the lower part of the text panel, blank without it
    corner = (slice(600, 850), slice(1150, 1550))
    assert (matplotlib.image.imread(plain)[corner][..., :3] == 1).all()
    assert not (matplotlib.image.imread(auto)[corner][..., :3] == 1).all()


def test_plot_cli_bad_log_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "step"}\nnot json\n')
    proc = subprocess.run([sys.executable, "-m", "psgd", "plot", str(bad), "-o",
                           str(tmp_path / "x.png")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "line 2: not JSON" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_read_log_rejects_non_records(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="not a psgd metrics record"):
        read_log(bad)
    with pytest.raises(ValueError, match="cannot open"):
        read_log(tmp_path / "missing.jsonl")


def hogwild_run(path, hist):
    log = MetricsLog(path)
    log.write("config", protocol="hogwild", n_workers=3, model="lenet")
    log.write("step", step=10, loss=1.0)
    log.write("summary", test_accuracy=0.5, staleness_histogram=hist, staleness_unit="updates")
    log.close()


def test_plot_axes_read_back(tmp_path):
    import matplotlib.pyplot as plt

    from psgd.plot import draw

    write_run(tmp_path / "ssp.jsonl", "ssp", [5, 3, 1])
    write_run(tmp_path / "run2.jsonl", "asp", [2, 2, 2, 2])
    hogwild_run(tmp_path / "hw.jsonl", [4, 9, 7, 1, 1, 0, 2])
    fig = draw([str(tmp_path / n) for n in ("ssp.jsonl", "run2.jsonl", "hw.jsonl")])
    try:
        hists = [ax for ax in fig.axes if ax.get_xlabel().startswith("staleness")]
        # clocks and hogwild's updates on separate axes, each with whole-number ticks
        assert [ax.get_xlabel() for ax in hists] == ["staleness (clocks)", "staleness (updates)"]
        for ax in hists:
            lo, hi = ax.get_xlim()
            ticks = [t for t in ax.get_xticks() if lo <= t <= hi]
            assert ticks and all(float(t).is_integer() for t in ticks), ticks
        labels = [t.get_text() for t in hists[0].get_legend().get_texts()]
        assert labels == ["ssp (s=2, W=2)", "run2 (asp s=2, W=2)"]   # no "ssp (ssp ...)"
        assert [t.get_text() for t in hists[1].get_legend().get_texts()] == ["hw (hogwild, W=3)"]
        assert fig._suptitle is not None and "3 runs" in fig._suptitle.get_text()
        text = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
        assert "pushes of 1010 bytes (7.9x fewer than float32)" in text
    finally:
        plt.close(fig)


def test_plot_goes_beside_the_log_and_makes_its_folder(tmp_path):
    write_run(tmp_path / "ssp.jsonl", "ssp", [5, 3, 1])
    assert plot_logs([str(tmp_path / "ssp.jsonl")]) == tmp_path / "ssp.png"
    assert (tmp_path / "ssp.png").read_bytes()[:4] == b"\x89PNG"
    out = plot_logs([str(tmp_path / "ssp.jsonl")], str(tmp_path / "new" / "p.png"))
    assert out.is_file()


def test_plot_of_a_non_log_file_names_it(tmp_path):
    h5 = tmp_path / "synth.h5"
    h5.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)))
    with pytest.raises(ValueError, match=r"log .*synth.h5: not a psgd JSON-lines log"):
        plot_logs([str(h5)], str(tmp_path / "x.png"))


def test_a_resumed_log_is_drawn_on_one_time_axis(tmp_path):
    import matplotlib.pyplot as plt

    from psgd.plot import draw

    path = tmp_path / "run.jsonl"
    write_run(path, "ssp", [5, 3, 1])
    first_end = read_log(path)[-1]["time"]
    log = MetricsLog(path, append=True)       # the resumed attempt: its clock starts at 0 again
    log.write("config", protocol="ssp", staleness=2, n_workers=2)
    log.write("step", step=60, loss=0.3)
    log.close()
    fig = draw([str(path)])
    try:
        loss_t = next(ax for ax in fig.axes if ax.get_xlabel() == "wall time (s)")
        times = loss_t.get_lines()[0].get_xdata()
        assert list(times) == sorted(times) and times[-1] >= first_end
        assert any(list(line.get_xdata()) == [first_end, first_end] for line in loss_t.get_lines())
    finally:
        plt.close(fig)


def gossip_run(path, distances):
    log = MetricsLog(path)
    log.write("config", protocol="gossip", topology="ring", n_workers=4, model="lenet")
    for i, d in enumerate(distances):
        log.write("step", step=10 * (i + 1), loss=1.0 / (i + 1), consensus_distance=d)
    log.write("summary", test_accuracy=0.5, consensus_distance=distances[-1])
    log.close()


def test_plot_draws_the_consensus_distance_of_a_gossip_log_only(tmp_path):
    import matplotlib.pyplot as plt

    from psgd.plot import draw

    distances = [3e-2, 4e-3, 5e-4, float("nan"), 2e-5]
    gossip_run(tmp_path / "gossip.jsonl", distances)
    write_run(tmp_path / "bsp.jsonl", "bsp", [9])
    consensus = lambda fig: [ax for ax in fig.axes if ax.get_ylabel() == "consensus distance"]
    fig = draw([str(tmp_path / "bsp.jsonl")])
    try:
        assert consensus(fig) == []
        assert len(fig.axes) == 6            # the figure without gossip is as it was
    finally:
        plt.close(fig)
    fig = draw([str(tmp_path / "bsp.jsonl"), str(tmp_path / "gossip.jsonl")])
    try:
        [ax] = consensus(fig)
        assert ax.get_yscale() == "log" and ax.get_xlabel() == "step (clock)"
        [line] = ax.get_lines()              # the bsp run has none to draw
        # the log's values as written, the non-finite record ("nan" in JSON) left out
        assert list(line.get_xdata()) == [10, 20, 30, 50]
        assert list(line.get_ydata()) == [3e-2, 4e-3, 5e-4, 2e-5]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["gossip (W=4)"]
    finally:
        plt.close(fig)


def traffic_run(path, protocol, sent, ratios=None):
    """A run whose step records carry the bytes sent per worker per step and, compressed, the
    compression ratio (as `psgd train --compress` writes them)."""
    log = MetricsLog(path)
    log.write("config", protocol=protocol, n_workers=2)
    for k, nbytes in enumerate(sent):
        log.write("step", step=10 * (k + 1), loss=1.0 / (k + 1), samples_per_s=1.0,
                  push_bytes_per_step=nbytes,
                  **({} if ratios is None else {"compression_ratio": ratios[k]}))
    log.close()


def test_plot_shows_bytes_per_step_and_the_compression_ratio_of_compressed_runs(tmp_path):
    """A panel of bytes sent per worker per step (every run that logs them) and one of the
    compression ratio (compressed runs), their lines the logs' values; without a compressed
    run the figure is as it was."""
    import matplotlib.pyplot as plt

    from psgd.plot import draw

    traffic_run(tmp_path / "none.jsonl", "asp", [3.2e6, 3.2e6, 3.2e6])
    traffic_run(tmp_path / "qsgd4.jsonl", "asp", [4.1e5, 4.0e5, 4.2e5], [7.81, 8.0, 7.62])
    write_run(tmp_path / "ssp.jsonl", "ssp", [1])
    by_label = lambda fig, y: [ax for ax in fig.axes if ax.get_ylabel() == y]
    fig = draw([str(tmp_path / n) for n in ("none.jsonl", "qsgd4.jsonl", "ssp.jsonl")])
    try:
        [sent] = by_label(fig, "bytes per worker per step")
        [ratio] = by_label(fig, "compression ratio (x)")
        logged = {n: [r for r in read_log(tmp_path / f"{n}.jsonl") if r["kind"] == "step"]
                  for n in ("none", "qsgd4")}
        assert [t.get_text() for t in sent.get_legend().get_texts()] == ["none (asp, W=2)",
                                                                         "qsgd4 (asp, W=2)"]
        for line, name in zip(sent.get_lines(), ("none", "qsgd4")):
            assert list(line.get_xdata()) == [r["step"] for r in logged[name]]
            assert list(line.get_ydata()) == [r["push_bytes_per_step"] for r in logged[name]]
        [line] = ratio.get_lines()
        assert list(line.get_xdata()) == [10, 20, 30]
        assert list(line.get_ydata()) == [r["compression_ratio"] for r in logged["qsgd4"]]
        assert list(line.get_ydata()) == [7.81, 8.0, 7.62]
        assert len(fig.axes) == 8
    finally:
        plt.close(fig)
    for names in (["ssp.jsonl"], ["none.jsonl", "ssp.jsonl"]):   # nothing compressed
        fig = draw([str(tmp_path / n) for n in names])
        try:
            assert by_label(fig, "compression ratio (x)") == [] and len(fig.axes) == 6
        finally:
            plt.close(fig)
    plot_logs([str(tmp_path / "qsgd4.jsonl")], str(tmp_path / "q.png"))
    assert (tmp_path / "q.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
