"""The bench scripts' --quick runs write well-formed results (no timings checked): run_all's report,
results.json and PNG charts, and each training benchmark's table, JSON and plot."""
import argparse
import json
import os
import signal
import subprocess
import sys
from numbers import Number
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SECTIONS = ["## Summary", "## Reproduce", "## Machine", "## Protocol comparison",
            "## Scaling", "## Kernels", "## All-reduce", "## Parameter server", "## Hogwild",
            "## Caveats"]
RUN_KEYS = ["samples_per_s", "wall_s", "final_accuracy", "time_to_target_s",
            "staleness_histogram", "worker_time", "evals"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "run_all.py"), "--quick",
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"bench/run_all.py --quick took over 240 s\n{stdout}\n{stderr}")
    assert proc.returncode == 0, f"run_all.py --quick failed\n{stdout}\n{stderr}"
    return out


def is_number(x):
    return isinstance(x, Number) and not isinstance(x, bool)


@pytest.mark.mpi
@pytest.mark.slow
def test_quick_bench_writes_report_with_every_section_and_table(quick_run):
    text = (quick_run / "REPORT.md").read_text()
    positions = [text.find(s) for s in SECTIONS]
    assert all(p >= 0 for p in positions), [s for s, p in zip(SECTIONS, positions) if p < 0]
    assert "oversubscribed" in text and "Target accuracy" in text
    assert "| bsp |" in text and "| single process |" in text
    for png in ("accuracy_vs_time.png", "time_split.png", "scaling.png"):
        assert f"]({png})" in text


@pytest.mark.mpi
@pytest.mark.slow
def test_quick_bench_results_json_has_numbers_for_every_run(quick_run):
    res = json.loads((quick_run / "results.json").read_text())
    assert res["quick"] is True and res["failed"] == []
    assert is_number(res["machine"]["nproc"]) and res["machine"]["cpu"]
    sec = res["sections"]
    assert {"kernels", "allreduce", "ps", "hogwild", "protocols", "scaling"} <= set(sec)
    for spec, rec in sec["kernels"]["models"].items():
        assert is_number(rec["psgd_samples_per_s"]) and rec["psgd_samples_per_s"] > 0, spec
    assert all(is_number(r[f"{m}_s"]) for r in sec["allreduce"]["rows"]
               for m in ("psgd", "p2p", "mpi"))
    raws = sec["ps"]["raw_runs_MB_s"]
    assert raws and all(is_number(x) and x > 0 for x in raws)
    for r in sec["ps"]["ps"]:   # each case's ratio is against a raw run next to it
        assert is_number(r["MB_s"]) and r["raw_MB_s"] in raws, r
        assert r["ratio_to_raw"] == pytest.approx(r["MB_s"] / r["raw_MB_s"]), r
        assert min(r["ratio_runs"]) <= r["ratio_to_raw"] <= max(r["ratio_runs"]), r
    assert all(is_number(r["updates_per_s"]) for r in sec["hogwild"]["results"])
    runs = sec["protocols"]["runs"]
    assert {r["name"] for r in runs} == {"bsp", "ssp s=1", "ssp s=4", "asp", "hogwild", "allreduce"}
    for run in runs + sec["protocols"]["baseline"]:
        assert "error" not in run, run
        missing = [k for k in RUN_KEYS if k not in run]
        assert not missing, (run["name"], missing)
        assert is_number(run["samples_per_s"]) and run["samples_per_s"] > 0
        assert 0.0 <= run["final_accuracy"] <= 1.0
        assert run["time_to_target_s"] is None or is_number(run["time_to_target_s"])
        assert all(is_number(v) for v in run["worker_time"].values())
        assert all(isinstance(c, int) for c in run["staleness_histogram"])
    bsp = next(r for r in runs if r["name"] == "bsp")
    assert len(bsp["staleness_histogram"]) == 1           # BSP: every update at staleness 0
    scaling = sec["scaling"]["rows"]
    assert scaling and all(isinstance(r["oversubscribed"], bool) for r in scaling)
    assert all(is_number(r["per_core_efficiency"]) for r in scaling)


@pytest.mark.mpi
@pytest.mark.slow
def test_quick_bench_charts_are_png_files(quick_run):
    from PIL import Image
    for name in ("accuracy_vs_time.png", "time_split.png", "scaling.png"):
        data = (quick_run / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 1000, name
        with Image.open(quick_run / name) as png:
            png.load()                                      # still a whole PNG
            assert "commit" in json.loads(png.text["provenance"]), name


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_async_quick_writes_its_table_json_and_plot(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_async.py"), "--quick",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "async-quick-synthetic.json").read_text())["rows"]
    assert {(r["protocol"], r["method"]) for r in rows} == {("bsp", "none"), ("asp", "none"),
                                                            ("asp", "amom")}
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["curve"] for r in rows), rows
    amom = next(r for r in rows if r["method"] == "amom")
    assert amom["compensation"]["method"] == "amom" and amom["comp_asked"] == "amom"
    table = (tmp_path / "async-quick-synthetic.md").read_text()
    assert "| mlp | 2 | asp | amom |" in table and "| mlp | 2 | bsp | none |" in table
    assert (tmp_path / "async-quick-synthetic.png").read_bytes().startswith(PNG_MAGIC)
    from PIL import Image     # matplotlib's own dependency
    with Image.open(tmp_path / "async-quick-synthetic.png") as png:   # the chart's stamp
        assert json.loads(png.text["provenance"])["dataset"] == "synthetic"
        assert png.size[0] > 100


def test_bench_async_add_keeps_the_earlier_grid_and_refuses_other_settings(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_async
    finally:
        sys.path.remove(str(ROOT / "bench"))
    args = argparse.Namespace(
        optimizer="momentum", lr=0.05, lr_schedule="constant", momentum=0.9, batch_size=64,
        epochs=2.0, eval_every=0, eval_samples=0, models=["lenet"], workers=[2], seeds=[2],
        protocols=["asp"], methods=["amom"])
    cell = {"model": "lenet", "workers": 2, "protocol": "asp", "method": "amom"}
    earlier = [{**cell, "seed": 0}, {**cell, "seed": 2}]
    path = tmp_path / "async.json"
    path.write_text(json.dumps({"settings": {k: getattr(args, k) for k in bench_async.SAME},
                                "rows": earlier}))
    assert bench_async.previous_rows(path, bench_async.cells(args), args) == [earlier[0]]
    args.lr = 0.1
    with pytest.raises(SystemExit, match="other settings .*lr 0.05"):
        bench_async.previous_rows(path, bench_async.cells(args), args)
    # a grid from before --lr-schedule existed ran with a constant rate
    args.lr = 0.05
    path.write_text(json.dumps({"settings": {k: getattr(args, k) for k in bench_async.SAME
                                             if k != "lr_schedule"}, "rows": earlier}))
    assert bench_async.previous_rows(path, bench_async.cells(args), args) == [earlier[0]]
    args.lr_schedule = "cosine"
    with pytest.raises(SystemExit, match="other settings .*lr_schedule constant"):
        bench_async.previous_rows(path, bench_async.cells(args), args)


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_compress_quick_writes_its_table_and_json(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_compress.py"), "--quick",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["compressor"]: r
            for r in json.loads((tmp_path / "compress-quick.json").read_text())["rows"]}
    assert set(rows) == {"fp16", "qsgd:1", "qsgd:4", "qsgd:4:l2", "qsgd:8", "topk:0.01", "sign"}
    assert rows["qsgd:4"]["ratio"] >= 7 and rows["sign"]["ratio"] >= 25
    assert rows["qsgd:1"]["ratio"] == pytest.approx(32 / (1 + 32 / 512), rel=1e-2)
    assert rows["topk:0.01"]["ratio"] >= 25 and rows["fp16"]["ratio"] == pytest.approx(2, rel=1e-3)
    assert all(r["psgd_gb_s"] > 0 and r["numpy_gb_s"] > 0 for r in rows.values())
    assert "| qsgd:4 |" in (tmp_path / "compress-quick.md").read_text()


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_compress_accuracy_quick_writes_its_table_and_json(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_compress_accuracy.py"),
                           "--quick", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["compressor"]: r for r in
            json.loads((tmp_path / "compress-accuracy-quick-synthetic.json").read_text())["rows"]}
    assert set(rows) == {"none", "sign"} and all(0 <= r["accuracy"] <= 1 for r in rows.values())
    assert rows["none"]["compression_ratio"] == pytest.approx(1.0, rel=0.01)
    assert rows["sign"]["compression_ratio"] > 25
    # asp with momentum: dana on the server; sign's error feedback moves the momentum to the
    # workers, where amom runs
    assert (rows["none"]["compensation"], rows["sign"]["compensation"]) == ("dana", "amom")
    assert "| 2 | asp | sign |" in (tmp_path / "compress-accuracy-quick-synthetic.md").read_text()


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_gossip_quick_writes_its_table_and_json(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_gossip.py"), "--quick",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "gossip-quick-synthetic.json").read_text())["rows"]
    assert {r["run"] for r in rows} == {"allreduce", "gossip ring", "gossip exponential",
                                        "adpsgd ring"}
    for r in rows:
        assert r["ok"] and 0.0 <= r["accuracy"] <= 1.0 and is_number(r["bytes_per_worker_step"])
        assert r["bytes_measured"] == (r["run"] != "allreduce"), r
    text = (tmp_path / "gossip-quick-synthetic.md").read_text()
    assert "| 2 | gossip ring |" in text and "vs allreduce" in text


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_stragglers_quick_writes_its_table_json_and_plot(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_stragglers.py"), "--quick",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads((tmp_path / "stragglers-quick-synthetic.json").read_text())["rows"]
    assert {(r["scenario"], r["protocol"]) for r in rows} == {
        ("none", "bsp"), ("none", "ssp auto"), ("slow", "bsp"), ("slow", "ssp auto")}
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["curve"], r
        times = [t for t, _, _ in r["curve"]]
        assert times == sorted(times) and all(0 <= a <= 1 for _, _, a in r["curve"])
        assert bool(r["bound"]) == (r["protocol"] == "ssp auto")   # auto logs its bound
    table = (tmp_path / "stragglers-quick-synthetic.md").read_text()
    assert "| slow | 2 | ssp auto |" in table and "| none | 2 | bsp |" in table
    assert (tmp_path / "stragglers-quick-synthetic.png").read_bytes().startswith(PNG_MAGIC)


def test_bench_compress_accuracy_bar_holds_a_gap_of_exactly_the_bar():
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_compress_accuracy import table
    accs = {"none": (0.8939, 0.8793, 0.8981), "qsgd:4": (0.8833, 0.8828, 0.8902),
            "fp16": (0.8842, 0.8816, 0.8848)}   # means -0.50 (in float64 -0.50000...1) and -0.69
    rows = [{"workers": 2, "protocol": "ssp s=2", "compressor": c, "ok": True, "accuracy": a,
             "push_bytes": 1, "compression_ratio": 1.0}
            for c, seeds in accs.items() for a in seeds]
    lines = {line.split(" | ")[2]: line for line in table(rows).splitlines()[2:]}
    assert "| ok (-0.5) |" in lines["qsgd:4"] and "| MISSED (-0.5) |" in lines["fp16"]
