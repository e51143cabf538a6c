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
              staleness_histogram=np.array(hist), loss=float("nan"))
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
