"""Elastic adpsgd: worker jobs merged with a coordinator, averaging pairwise, going on without a
SIGKILLed member (psgd.elastic.pairs; docs/guide/elastic.md). Every job is its own
``mpiexec -n 1`` in a session of its own, and every wait has a deadline."""
import os

import numpy as np
import pytest
from conftest import write_synth
from test_elastic import _kill, _records, _start, _until
from test_elastic_ring import _wait_all

pytestmark = pytest.mark.mpi

CLOCKS, W = 150, 4
KILL_AT = CLOCKS // 3


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_synth(tmp_path_factory.mktemp("pairs") / "synth.h5", 600, 200)


def _server_args(tmp, data, lr="1e-20", w=W) -> list:   # psgd refuses --lr 0
    return ["train", "--elastic", "--protocol", "adpsgd", "--servers", "0", "--data", data,
            "--model", "mlp:784-16-10", "--optimizer", "sgd", "--lr", lr,
            "--lr-schedule", "constant", "--steps", CLOCKS, "--port-file", tmp / "port",
            "--max-workers", w, "--stall-timeout", "5", "--no-worker-timeout", "60",
            "--log", tmp / "log.jsonl", "--checkpoint-dir", tmp / "ckpt"]


def _segments_gone(tmp) -> None:
    """The members' MPICH segments, as the coordinator logged them, are gone (it unlinks a
    lost member's; counting every unmapped one in /dev/shm would also count other tests'
    SIGKILLed jobs run meanwhile)."""
    paths = next(r for r in _records(tmp / "log.jsonl") if r["kind"] == "segments")["paths"]
    assert paths and not [p for p in paths if os.path.exists(p)], paths


def _run(tmp, data, victims: dict, dump: bool = True, w: int = W):
    """A coordinator and ``w`` joiners, joiner k SIGKILLing itself mid-pairing in clock
    ``victims[k]``; the jobs' exit codes, the coordinator's output and its summary."""
    outs = [tmp / f"{name}.out" for name in ["server"] + [f"joiner{k}" for k in range(w)]]
    files = [open(o, "w") for o in outs]
    env = {"PSGD_X_PAIRS_DUMP": str(tmp / "dump.npz")} if dump else None
    procs = [_start(_server_args(tmp, data, w=w), files[0], env=env)]
    _until("the port file", (tmp / "port").exists, procs)
    for k in range(w):   # one at a time, so that joiner k is worker k
        fault = {"PSGD_X_FAULT": f"rank=0,step={victims[k]},kind=kill"} if k in victims \
            else None
        procs.append(_start(["join", "--port-file", tmp / "port"], files[k + 1], env=fault))
        _until(f"worker {k} to join", lambda: f"worker {k} joined" in outs[0].read_text(),
               procs)
    _wait_all(procs, outs)
    for f in files:
        f.close()
    for p in procs:   # nothing of any job is left (each job is its own process group)
        with pytest.raises(ProcessLookupError):
            os.killpg(p.pid, 0)
    summary = next(r for r in _records(tmp / "log.jsonl") if r["kind"] == "summary")
    return [p.returncode for p in procs], outs[0].read_text(), summary


@pytest.mark.slow
@pytest.mark.parametrize("victim", [1, 2])   # a passive member, an active one
def test_adpsgd_goes_on_without_a_killed_member_and_conserves_the_survivors_sum(
        tmp_path, data, victim):
    """With --lr 1e-20 (no step moves a parameter by 1e-6 of a float32 ulp of the sums) every
    completed pairing keeps the members' sum, so the survivors' final
    parameters plus the lost member's last state that a survivor averaged with (its own
    start where none did) sum to the members' starting parameters."""
    codes, out, summary = _run(tmp_path, data, {victim: KILL_AT})
    assert codes[0] == 0, out
    assert [c != 0 for c in codes[1:]] == [k == victim for k in range(W)], (codes, out)
    _segments_gone(tmp_path)
    roster = {w["worker"]: w for w in summary["workers"]}
    assert [roster[k]["state"] for k in range(W)] == ["lost" if k == victim else "done"
                                                      for k in range(W)], summary
    lost = roster[victim]
    assert lost["after_s"] > 0 and lost["epoch"] == 1, lost
    # its clock when a survivor last averaged with it (a passive member runs ahead of the
    # active ones, so it may die past KILL_AT by its own count)
    assert lost["last_pairing_clock"] is None or 0 <= lost["last_pairing_clock"] < CLOCKS, lost
    assert f"worker {victim} lost (its process ended)" in out
    assert f"lost: worker {victim} after" in out
    assert all(roster[k]["steps"] == CLOCKS for k in range(W) if k != victim)
    dump = np.load(tmp_path / "dump.npz")
    starts = np.stack([dump[f"start_{k}"] for k in range(W)]).astype(np.float64)
    assert np.abs(starts - starts[0]).max() > 1e-3   # the members start apart
    finals = np.stack([dump[f"final_{k}"] for k in range(W) if k != victim]).astype(np.float64)
    ghost = (dump[f"ghost_{victim}"] if f"ghost_{victim}" in dump else starts[victim])
    np.testing.assert_allclose(finals.sum(0) + ghost, starts.sum(0), atol=2e-5)
    # the invariant can fail: without the lost member's share the sums differ, and so they do
    # with its start instead of its last state once a survivor averaged with it (a passive
    # member under load may die before any active one paired with it: its share is its start)
    assert np.abs(finals.sum(0) - starts.sum(0)).max() > 1e-3
    if f"ghost_{victim}" in dump:
        assert np.abs(finals.sum(0) - (starts.sum(0) - starts[victim])).max() > 1e-3
    # the survivors averaged with each other after the death (they came closer together)
    spread = np.abs(finals - finals.mean(0)).max()
    assert spread < np.abs(starts - starts.mean(0)).max()


@pytest.mark.slow
def test_adpsgd_learns_on_with_a_killed_member(tmp_path, data):
    """With a real learning rate the survivors' mean model, in the checkpoint, is evaluated
    and beats chance."""
    outs = [tmp_path / f"{name}.out" for name in ["server"] + [f"joiner{k}" for k in range(W)]]
    files = [open(o, "w") for o in outs]
    procs = [_start(_server_args(tmp_path, data, lr="0.1"), files[0])]
    _until("the port file", (tmp_path / "port").exists, procs)
    for k in range(W):
        fault = {"PSGD_X_FAULT": f"rank=0,step={KILL_AT},kind=kill"} if k == 3 else None
        procs.append(_start(["join", "--port-file", tmp_path / "port"], files[k + 1], env=fault))
    _wait_all(procs, outs)
    for f in files:
        f.close()
    out = outs[0].read_text()
    assert procs[0].returncode == 0, out
    summary = next(r for r in _records(tmp_path / "log.jsonl") if r["kind"] == "summary")
    assert summary["test_accuracy"] > 0.3, summary
    assert os.path.exists(summary["checkpoint"])
    _kill(procs)


@pytest.mark.slow
def test_adpsgd_goes_on_after_two_deaths_at_different_times_and_conserves_the_sum(
        tmp_path, data):
    """Five members; the active workers 0 and 2 are SIGKILLed in clocks 30 and 120. Active
    members only ever pair with passive ones, so the two dead never averaged with each other:
    every pairing either of them completed was with a survivor, and the survivors' finals plus
    each lost member's last state that a survivor averaged with still sum to the starts. (Two
    dead of different roles may have paired with each other after their last pairings with
    survivors; no survivor then knows their share, so that case has no such check.)"""
    w, victims = 5, {0: 30, 2: 120}
    codes, out, summary = _run(tmp_path, data, victims, w=w)
    assert codes[0] == 0, out
    assert [c != 0 for c in codes[1:]] == [k in victims for k in range(w)], (codes, out)
    _segments_gone(tmp_path)
    roster = {r["worker"]: r for r in summary["workers"]}
    assert [roster[k]["state"] for k in range(w)] == ["lost", "done", "lost", "done", "done"]
    # seen gone one after the other, each a new epoch (actives keep no common pace: under
    # load worker 0 once reached its clock 40 after worker 2 reached 90)
    assert sorted(roster[k]["epoch"] for k in victims) == [1, 2], summary
    assert summary["epochs"] == 2 and roster[0]["after_s"] != roster[2]["after_s"]
    for k, clock in victims.items():
        assert f"worker {k} lost (its process ended)" in out
        assert 0 <= roster[k]["last_pairing_clock"] <= clock, roster[k]
    assert all(roster[k]["steps"] == CLOCKS for k in (1, 3, 4))
    dump = np.load(tmp_path / "dump.npz")
    starts = np.stack([dump[f"start_{k}"] for k in range(w)]).astype(np.float64)
    finals = np.stack([dump[f"final_{k}"] for k in (1, 3, 4)]).astype(np.float64)
    ghosts = {k: dump[f"ghost_{k}"].astype(np.float64) for k in victims}
    np.testing.assert_allclose(finals.sum(0) + ghosts[0] + ghosts[2], starts.sum(0), atol=3e-5)
    for k in victims:   # each lost member's share counts
        assert np.abs(finals.sum(0) + ghosts[k] - starts.sum(0)).max() > 1e-3
    # the three survivors (one active, two passive) kept averaging after the second death
    assert np.abs(finals - finals.mean(0)).max() < np.abs(starts - starts.mean(0)).max()
