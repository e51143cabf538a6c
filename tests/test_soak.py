"""Soak (make soak): 6 ranks on 2 cores train for minutes under asp and ssp without deadlock or leaks.

Memory bound: every rank's resident set (VmRSS) may grow by at most
``RSS_BOUND_MB`` (40 MB) between the first sample after warm-up and the last
sample, and all ranks together by at most twice that.  Duration per protocol:
``PSGD_SOAK_SECONDS`` (default 150).
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import marked_pids, mpiexec_path, wait_marked_gone, write_synth

RSS_BOUND_MB = 40.0
DURATION_S = float(os.environ.get("PSGD_SOAK_SECONDS", "150"))
WARMUP_S = min(30.0, DURATION_S / 4)
SAMPLE_EVERY_S = 5.0
PROGRESS_S = 45.0   # the lead worker must log a new step at least this often


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_synth(tmp_path_factory.mktemp("soak") / "synth.h5", 4800, 200)


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _last_step(log: Path) -> int:
    step = -1
    if log.exists():
        for line in log.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if record.get("kind") == "step":
                step = record["step"]
    return step


@pytest.mark.soak
@pytest.mark.parametrize("protocol", ["asp", "ssp"])
def test_soak_six_ranks_no_deadlock_no_memory_growth(dataset, tmp_path, protocol):
    marker = uuid.uuid4().hex
    log = tmp_path / "soak.jsonl"
    env = dict(os.environ, PSGD_X_TEST_MARK=marker, PYTHONUNBUFFERED="1")
    cmd = [mpiexec_path(), "-n", "6", sys.executable, "-m", "psgd", "train", "--data", dataset,
           "--quiet", "--model", "mlp:784-128-10", "--protocol", protocol, "--servers", "2",
           "--optimizer", "momentum", "--lr", "0.01", "--batch-size", "32",
           "--steps", "100000000", "--log", str(log), "--log-every", "50",
           "--stall-timeout", "20", "--stall-abort", "60"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    samples: dict[int, list[float]] = {}
    t0 = time.monotonic()
    last_step, last_progress = -1, t0
    try:
        while time.monotonic() - t0 < DURATION_S:
            time.sleep(SAMPLE_EVERY_S)
            assert proc.poll() is None, f"the job ended early: {proc.communicate()[1]}"
            step = _last_step(log)
            now = time.monotonic()
            if step > last_step:
                last_step, last_progress = step, now
            assert now - last_progress < PROGRESS_S, f"no progress for {now - last_progress:.0f} s"
            if now - t0 >= WARMUP_S:
                for pid in marked_pids(marker, ranks_only=True):
                    rss = _rss_mb(pid)
                    if rss is not None:
                        samples.setdefault(pid, []).append(rss)
        # end it the way a user would (Ctrl-C): every rank must go, within seconds
        os.killpg(proc.pid, signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the job did not end within 30 s of SIGINT")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert len(samples) == 6, samples
    growth = {pid: s[-1] - s[0] for pid, s in samples.items()}
    report = ", ".join(f"pid {pid}: {s[0]:.0f} -> {s[-1]:.0f} MB" for pid, s in samples.items())
    print(f"\nsoak {protocol}: {DURATION_S:.0f} s, {last_step} steps logged by the lead worker; "
          f"RSS after warm-up -> end: {report}; total growth {sum(growth.values()):.1f} MB")
    assert max(growth.values()) < RSS_BOUND_MB, report
    assert sum(growth.values()) < 2 * RSS_BOUND_MB, report
    assert last_step > 0
    assert not wait_marked_gone(marker, 10, ranks_only=True), "ranks left behind after the interrupt"
