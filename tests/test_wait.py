"""Waiting does not spin a core; a stalled wait is reported, then ends the job."""
import time

import pytest


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


class _Request:
    """Stands in for an MPI request: completes once ``done()`` says so."""

    def __init__(self, done):
        self.done = done
        self.polls = 0

    def Test(self, status=None):
        self.polls += 1
        return self.done(self)


def _record(monkeypatch):
    """Count sched_yield calls and record sleeps (with the time each began) instead of sleeping."""
    from psgd.mpi import wait
    calls = {"yield": 0, "sleep": []}
    monkeypatch.setattr(wait.os, "sched_yield", lambda: calls.__setitem__("yield", calls["yield"] + 1))
    monkeypatch.setattr(wait.time, "sleep", lambda s: calls["sleep"].append(time.perf_counter()))
    return calls


def test_yield_spin_yields_between_polls_and_never_sleeps_within_spin_s(monkeypatch):
    from psgd.mpi import wait
    calls = _record(monkeypatch)
    t0 = time.perf_counter()
    request = _Request(lambda r: time.perf_counter() - t0 > 0.05)
    wait.wait(request, "peer", spin_s=1.0)
    assert calls["sleep"] == []
    assert calls["yield"] >= request.polls - 2 > 0


def test_yield_spin_ends_after_spin_s_then_backoff_sleeps(monkeypatch):
    from psgd.mpi import wait
    calls = _record(monkeypatch)
    t0 = time.perf_counter()
    request = _Request(lambda r: len(calls["sleep"]) >= 5)
    wait.wait(request, "peer", spin_s=0.03)
    assert calls["yield"] > 0
    assert len(calls["sleep"]) == 5
    assert calls["sleep"][0] - t0 >= 0.03


def test_plain_wait_spins_briefly_then_sleeps_without_yielding(monkeypatch):
    from psgd.mpi import wait
    calls = _record(monkeypatch)
    request = _Request(lambda r: len(calls["sleep"]) >= 3)
    wait.wait(request, "peer")
    assert calls["yield"] == 0
    assert request.polls == wait.SPIN + 4      # SPIN bare polls, then one sleep per poll


def test_waitall_starts_its_backoff_over_when_some_requests_complete(monkeypatch):
    """A pull's payload lands right behind its header: after a completion, poll densely again."""
    from types import SimpleNamespace

    from psgd.mpi import wait
    sleeps = []
    monkeypatch.setattr(wait.time, "sleep", sleeps.append)
    polls = {"n": 0}
    requests = [_Request(None), _Request(None)]   # truthy, like live MPI requests

    def testsome(reqs):
        polls["n"] += 1
        if len(sleeps) == 6 and reqs[0] is not None:     # the first completes after 6 sleeps
            reqs[0] = None
            return [0]
        if len(sleeps) == 9:                             # the second 3 sleeps later
            reqs[1] = None
            return [1]
        return []

    monkeypatch.setattr(wait, "MPI", SimpleNamespace(Request=SimpleNamespace(Testsome=testsome)))
    wait.waitall(requests, "peers")
    backoff = [wait.MIN_SLEEP * wait.GROWTH ** k for k in range(6)]
    assert sleeps == pytest.approx(backoff + backoff[:3])   # starts over at the shortest sleep
    # and with SPIN bare polls again: (SPIN bare + 6 sleeping + 1 completing) then (SPIN + 3 + 1)
    assert polls["n"] == 2 * wait.SPIN + 11


def test_poller_waited_counts_from_the_start_of_the_wait():
    from psgd.mpi import wait
    poller = wait.Poller("peer")
    assert 0 <= poller.waited() < 0.05
    time.sleep(0.02)
    assert poller.waited() >= 0.02
