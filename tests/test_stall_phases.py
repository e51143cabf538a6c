"""A rank frozen (SIGSTOP) at any moment from launch to the end is reported, then the job ends."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import marked_pids, mpiexec_path, shm_left, wait_marked_gone

STEPS = 40
BOUND_S = 40   # the job must be over well before this (stall abort 4 s + start-up on a loaded VM)


def _rank_pid(marker: str, rank: int) -> int | None:
    """The pid of ``rank`` itself (not the MPI_Init watchdog it forks), or None."""
    pids = marked_pids(marker, ranks_only=True)
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if f"PMI_RANK={rank}".encode() in env and ppid not in pids:
            return pid
    return None


def _logged(log: Path, kind: str) -> bool:
    if not log.exists():
        return False
    return any(json.loads(line)["kind"] == kind
               for line in log.read_text().splitlines() if line.endswith("}"))


SSP = ["--model", "mlp:784-32-10", "--protocol", "ssp", "--steps", str(STEPS)]


def _run_and_freeze(dataset, tmp_path, when, env=None, run=SSP, ranks=3, rank=2):
    """Start ``run`` (ssp) on ``ranks`` ranks; SIGSTOP rank ``rank`` once ``when(log)`` holds;
    returns the result."""
    marker, log = f"freeze-{os.getpid()}-{time.monotonic_ns()}", tmp_path / "log.jsonl"
    shm_before = set(os.listdir("/dev/shm"))
    cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "psgd", "train", "--data",
           dataset, *run, "--quiet", "--log", str(log), "--stall-timeout", "1",
           "--stall-abort", "4"]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PSGD_X_TEST_MARK=marker, **(env or {})),
                            start_new_session=True)
    frozen = None
    while frozen is None and proc.poll() is None and time.monotonic() - start < BOUND_S:
        pid = _rank_pid(marker, rank)
        if pid is not None and when(log):
            os.kill(pid, signal.SIGSTOP)
            frozen = pid
        time.sleep(0.005)
    try:
        out, err = proc.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"hung\n--- stdout\n{out}\n--- stderr\n{err}")
    elapsed = time.monotonic() - start
    # the launcher may return before its ranks are reaped
    assert not wait_marked_gone(marker, 5), "a rank was left behind"
    for name in shm_left(shm_before):   # an aborted MPICH job cannot free its segments
        Path("/dev/shm", name).unlink(missing_ok=True)
    return proc.returncode, err, elapsed, frozen


def _assert_reported_then_ended(rc, err, waits_for):
    assert rc != 0, err
    # a wait in the training loop reports itself; one in a set-up or teardown phase, the watchdog
    assert re.search(r"psgd: rank \d stalled: (waiting \d+ s for |\d+ s in phase ).*" + waits_for,
                     err), err
    assert re.search(r"psgd: error: rank \d: .*stall abort limit 4 s", err), err


@pytest.mark.parametrize("moment, when, waits_for", [
    ("launch", lambda log: True, r"MPI_Init"),
    # wherever set-up is when rank 2 stops, the others name it
    ("set-up", lambda log: _logged(log, "config"), r"rank 2 does not answer"),
    ("training", lambda log: _logged(log, "step"), r"worker rank\(s\) \[2\] to push clock"),
])
def test_worker_frozen_is_reported_then_the_job_ends(dataset, tmp_path, moment, when, waits_for):
    rc, err, elapsed, frozen = _run_and_freeze(dataset, tmp_path, when)
    assert frozen, f"the run ended before rank 2 was frozen at {moment}: {err}"
    _assert_reported_then_ended(rc, err, waits_for)
    assert elapsed < BOUND_S


def test_worker_stuck_at_the_final_gather_is_named_then_the_job_ends(dataset, tmp_path):
    rc, err, elapsed, _ = _run_and_freeze(dataset, tmp_path, lambda log: False,
                                          env={"PSGD_X_FAULT": f"rank=2,step={STEPS},kind=hang"})
    _assert_reported_then_ended(rc, err, re.escape("rank 2 to send its end-of-run report"))
    assert elapsed < BOUND_S


def test_a_frozen_pipeline_stage_is_named_by_its_neighbour_with_the_microbatch_and_direction(
        dataset, tmp_path):
    """The last stage frozen mid-run: stage 0's report names the stage, the microbatch and the
    direction it waits on (the gradient coming back), then the job ends."""
    run = ["--model", "mlp:784-32-32-10", "--pipeline", "2", "--microbatches", "4",
           "--schedule", "1f1b", "--batch-size", "32", "--steps", "100000",
           "--log-every", "5"]
    rc, err, elapsed, frozen = _run_and_freeze(dataset, tmp_path, lambda log: _logged(log, "step"),
                                               run=run, ranks=2, rank=1)
    assert frozen, f"the run ended before stage 1 was frozen: {err}"
    _assert_reported_then_ended(rc, err, r"stage 0: the gradient from stage 1 of microbatch \d+")
    assert elapsed < BOUND_S
