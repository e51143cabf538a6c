"""bench/common.py: every result file carries its provenance stamp; synthetic results never
take a name that stands for Fashion-MNIST; outputs go to runs/bench/ unless published."""
import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))
import common  # noqa: E402

# helper modules of the scripts (imported, never run as a benchmark of their own)
MODULES = {"common.py", "report.py", "training.py", "protocols.py", "text_corpus.py",
           "peer_data.py", "peer_torch_train.py"}


def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_result_file_carries_the_stamp(tmp_path):
    t0 = time.time()
    proc = subprocess.run([sys.executable, str(BENCH / "bench_compress.py"), "--quick", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stamp = json.loads((tmp_path / "compress-quick.json").read_text())["provenance"]
    assert stamp["commit"] == git("rev-parse", "HEAD")
    assert stamp["dirty"] == bool(git("status", "--porcelain"))
    assert stamp["machine"]["cores"] == os.cpu_count()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert stamp["machine"]["cpu"] and stamp["machine"]["cpu"] in cpuinfo
    assert stamp["command"] == f"python bench/bench_compress.py --quick --out {tmp_path}"
    utc = time.mktime(time.strptime(stamp["utc"], "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    assert t0 - 2 <= utc <= time.time() + 2
    assert stamp["dataset"] == common.NO_DATA
    last = (tmp_path / "compress-quick.md").read_text().splitlines()[-1]
    assert stamp["commit"][:12] in last and stamp["utc"] in last and "bench_compress.py" in last


def test_a_fashion_mnist_named_result_is_refused_from_synthetic_data(tmp_path):
    for write in (common.write_json, common.write_text):
        payload = {"rows": []} if write is common.write_json else "| table |"
        with pytest.raises(SystemExit, match="refusing to write .*async.* synthetic"):
            write(tmp_path / f"async.{'json' if write is common.write_json else 'md'}",
                  payload, common.SYNTHETIC)
        assert not list(tmp_path.iterdir())    # nothing written, not even a temp file
    common.write_json(tmp_path / "async-synthetic.json", {"rows": [1]}, common.SYNTHETIC)
    common.write_json(tmp_path / "async.json", {"rows": [1]}, common.FASHION)
    assert json.loads((tmp_path / "async.json").read_text())["provenance"]["dataset"] == \
        common.FASHION


def test_the_name_says_synthetic_when_fashion_mnist_is_missing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "FMNIST", tmp_path / "no-such-dir")
    assert common.result_stem("async", quick=False) == "async-synthetic"
    data = common.dataset(tmp_path, quick=False, bench="bench-x", train=128)
    assert data.name == common.SYNTHETIC and data.path.exists()
    assert "WARNING: Fashion-MNIST is not installed" in capsys.readouterr().out
    monkeypatch.setattr(common, "FMNIST", tmp_path)            # "installed"
    assert common.result_stem("async", quick=False) == "async"
    assert common.result_stem("async-quick", quick=True) == "async-quick-synthetic"


def test_write_json_keeps_the_stamps_of_a_file_added_to(tmp_path):
    path = tmp_path / "gossip.json"
    path.write_text(json.dumps({"provenance": {"commit": "old"}, "rows": [1]}))
    common.write_json(path, {"rows": [1, 2]}, common.FASHION)
    saved = json.loads(path.read_text())
    assert saved["provenance_before"] == [{"commit": "old"}] and saved["rows"] == [1, 2]


def test_results_go_to_runs_bench_unless_published(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RUNS", tmp_path / "runs" / "bench")
    monkeypatch.setattr(common, "RESULTS", tmp_path / "results")
    args = argparse.Namespace(out=None, publish=False)
    out = common.out_dir(args, "ps")
    assert out.parent == tmp_path / "runs" / "bench" and out.is_dir()
    assert re.fullmatch(r"ps-\d{8}T\d{6}Z", out.name)
    published = common.out_dir(argparse.Namespace(out=None, publish=True), "ps",
                               publish_to=common.RESULTS)
    assert published == tmp_path / "results"
    with pytest.raises(SystemExit, match="--out DIR or --publish"):
        common.out_dir(argparse.Namespace(out=str(tmp_path), publish=True), "ps")
    assert "/runs/" in (ROOT / ".gitignore").read_text()


def test_mpiexec_honours_MPIEXEC_and_MPI_system(tmp_path, monkeypatch):
    monkeypatch.setenv("MPIEXEC", "/opt/mpi/bin/mpiexec")
    assert common.mpiexec() == "/opt/mpi/bin/mpiexec"
    monkeypatch.delenv("MPIEXEC")
    monkeypatch.delenv("PSGD_MPIEXEC", raising=False)
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("MPI", "system")
    assert common.mpiexec() == str(fake)          # not the one beside this Python


def test_every_bench_script_uses_common_and_has_a_make_target():
    makefile = (ROOT / "Makefile").read_text()
    for path in sorted(BENCH.glob("*.py")):
        text = path.read_text()
        assert ".venv/bin/mpiexec" not in text, path.name
        if path.name in MODULES:
            continue
        assert re.search(r"^import common\b", text, re.M), f"{path.name} does not use common.py"
        assert f"bench/{path.name}" in makefile, f"{path.name} has no make target"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("*.py")
                                          if p.name not in MODULES
                                          and p.name != "merge_straggler_runs.py"))
def test_every_bench_script_offers_out_and_publish(script):
    if "peer" in script:   # runs PyTorch beside psgd: make install-peer (make test-all) has it
        pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "--out" in proc.stdout and "--publish" in proc.stdout, proc.stdout


def test_merged_straggler_runs_keep_the_synthetic_name(tmp_path):
    row = {"scenario": "none", "workers": 2, "protocol": "ssp s=1", "seed": 0,
           "time_to_target": 1.0}
    for i in (0, 1):
        (tmp_path / f"r{i}").mkdir()
        common.write_json(tmp_path / f"r{i}" / "stragglers-synthetic.json",
                          {"data": common.SYNTHETIC, "settings": {}, "rows": [dict(row, seed=i)]},
                          common.SYNTHETIC)
    merge = [sys.executable, str(BENCH / "merge_straggler_runs.py")]
    proc = subprocess.run([*merge, str(tmp_path / "stragglers.json"), str(tmp_path / "r0"),
                           str(tmp_path / "r1")], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "refusing to write" in proc.stderr
    assert not (tmp_path / "stragglers.json").exists()
    out = tmp_path / "stragglers-synthetic.json"
    proc = subprocess.run([*merge, str(out), str(tmp_path / "r0"), str(tmp_path / "r1")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads(out.read_text())
    assert [r["seed"] for r in saved["rows"]] == [0, 1]
    assert saved["provenance"]["dataset"] == common.SYNTHETIC


def test_a_published_result_makes_its_docs_page(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "ROOT", tmp_path)
    (tmp_path / "bench" / "results").mkdir(parents=True)
    result = common.write_json(tmp_path / "bench" / "results" / "x.json", {"rows": []},
                               common.NO_DATA)
    stamp = json.loads(result.read_text())["provenance"]
    page = common.docs_page("x", "X", "What x measures.", "| a |\n|---|\n| 1 |", [result])
    assert page == tmp_path / "docs" / "results" / "x.md"
    text = page.read_text()
    for row in (f"| command | `{stamp['command']}` |", f"| commit | `{stamp['commit']}`",
                f"| date (UTC) | {stamp['utc']} |", "| results | `bench/results/x.json` |",
                f"| machine | {stamp['machine']['cpu']}, {os.cpu_count()} cores |"):
        assert row in text, row
    assert text.startswith("# X\n\nWhat x measures.\n\n| a |")
