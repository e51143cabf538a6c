"""dana under --elastic with real kills (tests/test_elastic.py's jobs): a worker's whole
mpiexec SIGKILLed mid-run, a joiner killed while its first look-ahead reply is on its way,
and a run killed whole after a loss and resumed."""
import os
import signal

import pytest
from test_elastic import UPDATES, Run, _kill, _records, _tree, _until, data  # noqa: F401
from test_elastic_kills import _nothing_left_beside, _stopped

from psgd.elastic import segments_of
from psgd.run.checkpoint import load_checkpoint

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

DANA = ["--optimizer", "momentum", "--momentum", "0.9", "--lr", "0.02",
        "--staleness-comp", "dana"]


def _doomed(proc) -> set:
    """The MPICH segments a job's processes map (read before it is killed)."""
    found = {path for pid in _tree(proc.pid) for path in segments_of(pid)}
    assert found, "the job maps no MPICH segment"
    return found


def _checked(run, summary, doomed) -> dict:
    """What every case checks: dana ran, one worker lost and one done, every applied push
    counted, the run's length reached, nothing of the killed job left."""
    config = next(r for r in _records(run.log) if r["kind"] == "config")
    assert config["staleness_comp"] == "dana", config
    states = {w["worker"]: w for w in summary["workers"]}
    assert sorted(w["state"] for w in states.values()) == ["done", "lost"], states
    assert UPDATES <= summary["updates"] < UPDATES + 2, summary
    assert sum(w["pushes"] for w in states.values()) == summary["updates"]
    assert summary["test_loss"] == summary["test_loss"] < 10, summary   # finite, not diverged
    left = [path for path in doomed if os.path.exists(path)]
    assert not left, f"the killed job's MPICH segment was left: {left}"
    _nothing_left_beside(run.port)
    return next(w for w in states.values() if w["state"] == "lost")


@pytest.mark.parametrize("protocol, extra", [("asp", []), ("ssp", ["--staleness", "2"])])
def test_a_dana_run_goes_on_after_a_worker_is_killed_mid_run(tmp_path, data, protocol, extra):
    run = Run(tmp_path, data, protocol=protocol, extra=[*DANA, *extra])
    first = [run.join(0), run.join(1)]
    _until("30 % of the updates", lambda: run.updates() >= 0.3 * UPDATES, run.procs)
    doomed = _doomed(first[0])
    os.killpg(first[0].pid, signal.SIGKILL)
    summary = run.finish()   # no job hangs, and the server ends with 0
    assert "lost: its process ended" in run.output("server"), run.output("server")
    lost = _checked(run, summary, doomed)
    assert 0.05 * UPDATES <= lost["pushes"] < 0.4 * UPDATES, lost


def test_a_joiner_killed_before_it_takes_its_look_ahead_reply_is_dropped(tmp_path, data):
    """With a worker already pushing, the joiner's first pull is answered with dana's
    look-ahead (the method's own buffer); the joiner stops before it receives it and its job is
    SIGKILLed: the run goes on and ends. (It passes with the method's pending sends kept too:
    here the send completes anyway; tests/test_elastic_dana.py pins that they are forgotten.)"""
    run = Run(tmp_path, data, extra=[*DANA, "--stall-timeout", "6"])
    run.join(0)
    _until("the first worker's updates", lambda: run.updates() >= 100, run.procs)
    dead = run.join(1, {"PSGD_X_FAULT": "rank=0,phase=receiving the first parameters,"
                                        "kind=stop"})
    _until("the joiner to stop", lambda: _stopped(_tree(dead.pid)), run.procs)
    doomed = _doomed(dead)
    os.killpg(dead.pid, signal.SIGKILL)
    summary = run.finish()
    lost = _checked(run, summary, doomed)
    assert lost["pushes"] == 0 and lost["joined_at"] >= 100, lost


def test_a_resumed_dana_run_gives_the_live_workers_velocities_to_its_joiners(tmp_path, data):
    """Three workers, one SIGKILLed, then the whole run; the last checkpoint holds the two
    live workers' velocities and a zero one for the lost worker, and the resumed run's two
    joiners take the live workers' slots."""
    ckpt = tmp_path / "ckpt"
    keep = [*DANA, "--checkpoint-dir", ckpt, "--checkpoint-every", "100", "--max-workers", "4"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = Run(tmp_path / "a", data, extra=keep)
    joiners = [first.join(0)]   # alone first, so that it takes slot 0, which resumed joiners
    _until("the first join", lambda: first.updates() >= 50, first.procs)   # would take first
    joiners += [first.join(1), first.join(2)]
    _until("20 % of the updates", lambda: first.updates() >= 0.2 * UPDATES, first.procs)
    os.killpg(joiners[0].pid, signal.SIGKILL)
    record = _until("the loss", lambda: [r for r in _records(first.log) if r["kind"] == "lost"],
                    first.procs)[0]
    lost = record["worker"]
    assert lost == 0, record
    _until("two checkpoints after the loss",
           lambda: first.updates() >= max(0.5 * UPDATES, record["updates"] + 250), first.procs)
    _kill(first.procs)   # the whole run
    saved = load_checkpoint(sorted(ckpt.glob("ckpt-*.h5"))[-1])
    assert saved.step > record["updates"], (saved.step, record)   # written after the loss
    moving = [w for w in range(4) if saved.opt_state[f"dana_velocity_{w}"].any()]
    assert moving == sorted({0, 1, 2} - {lost}), (moving, lost)
    second = Run(tmp_path / "b", data, extra=[*keep, "--resume", "auto"])
    second.join(0), second.join(1)
    summary = second.finish()
    assert f"resumed run {saved.run_id}" in second.output("server")
    assert sorted(w["worker"] for w in summary["workers"]) == moving, summary["workers"]
    assert UPDATES <= summary["updates"] < UPDATES + 2, summary
