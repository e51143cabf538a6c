"""Waiting does not spin a core; a stalled wait is reported, then ends the job."""
import time


def test_idle_wait_uses_little_cpu(mpirun):
    out = mpirun(2, ["idle_cpu_check.py"], timeout=60).stdout
    assert "idle wait" in out


def test_stall_is_reported_then_ends_job(mpirun):
    t0 = time.monotonic()
    proc = mpirun(2, ["stall_check.py"], timeout=60, check=False)
    assert proc.returncode != 0
    assert "rank 1 stalled: waiting" in proc.stderr
    assert "for rank 0 to push clock 5 of shard 0" in proc.stderr
    assert "stall abort limit" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 30
