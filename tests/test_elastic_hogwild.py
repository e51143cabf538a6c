"""Elastic hogwild: worker jobs merged with the coordinator, which holds the RMA windows, go on
without a SIGKILLed member (psgd.elastic.hogwild; docs/guide/elastic.md). Every job is its own
``mpiexec -n 1`` in a session of its own, and every wait has a deadline.

The end state's invariant: the run's updates are tickets 0..UPDATES-1 of the global counter,
each worker adds 1 to its own tally after each update it applied, and a worker stops at its
first ticket past the last. So the counter ends at UPDATES plus one per survivor, a survivor's
tally equals the updates it reports, and the tallies sum to UPDATES less one per worker killed
between its ticket and its tally (the one killed mid-accumulate)."""
import os
import signal
import subprocess
import time

import numpy as np
import pytest
from conftest import write_synth
from test_elastic import _kill, _records, _start, _tree, _until
from test_elastic_kills import _stopped

from psgd.run.checkpoint import load_checkpoint

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

UPDATES, W, KILL_AT, VICTIM = 3000, 3, 300, 1
DEADLINE_S = 180


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_synth(tmp_path_factory.mktemp("hogwild") / "synth.h5", 600, 200)


class Run:
    """The coordinator and W joiners, joiner k admitted as worker k; joiner VICTIM's
    PSGD_X_FAULT is ``fault``."""

    def __init__(self, tmp, data, fault: str | None = None, stall_s: float = 5,
                 no_worker_s: float = 60) -> None:
        self.tmp, self.log = tmp, tmp / "log.jsonl"
        self.outs = [tmp / f"{name}.out" for name in ["server"] + [f"joiner{k}" for k in range(W)]]
        self.files = [open(o, "w") for o in self.outs]
        self.procs = [_start(["train", "--elastic", "--protocol", "hogwild", "--servers", "1",
                              "--data", data, "--model", "mlp:784-32-10", "--optimizer", "sgd",
                              "--lr", "0.05", "--lr-schedule", "constant", "--steps", UPDATES,
                              "--port-file", tmp / "port", "--max-workers", W,
                              "--stall-timeout", stall_s, "--no-worker-timeout", no_worker_s,
                              "--log", self.log, "--checkpoint-dir", tmp / "ckpt"],
                             self.files[0])]
        _until("the port file", (tmp / "port").exists, self.procs)
        for k in range(W):
            env = {"PSGD_X_FAULT": f"rank=0,{fault}"} if fault and k == VICTIM else None
            self.procs.append(_start(["join", "--port-file", tmp / "port"], self.files[k + 1],
                                     env=env))
            _until(f"joiner {k} to join", lambda: f"worker {k} joined" in self.text(0),
                   self.procs)

    def text(self, k: int) -> str:
        return self.outs[k].read_text()

    def wait(self, procs=None) -> None:
        t0 = time.monotonic()
        for p in procs or self.procs:
            try:
                p.wait(timeout=max(1.0, DEADLINE_S - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                _kill(self.procs)
                pytest.fail("a job did not end:\n" + "\n".join(o.read_text() for o in self.outs))

    def close(self) -> dict:
        """Wait for every job; check that none is left and that the members' segments are gone;
        the summary."""
        self.wait()
        for f in self.files:
            f.close()
        for p in self.procs:   # nothing of any job is left (each job is its own process group)
            with pytest.raises(ProcessLookupError):
                os.killpg(p.pid, 0)
        records = _records(self.log)
        paths = next(r for r in records if r["kind"] == "segments")["paths"]
        assert len(paths) >= W and not [p for p in paths if os.path.exists(p)], paths
        return next(r for r in records if r["kind"] == "summary")


def _check_end(run: Run, summary: dict, lost_applied: int | None, torn: tuple,
               seen_mid_run: bool = True) -> None:
    """The coordinator's and the survivors' exit codes, the lost worker, the counter invariant
    (``torn``: the updates the lost worker may have had between its ticket and its tally), and
    the final parameters; ``seen_mid_run``: the loss was seen before the run's last update."""
    server = run.text(0)
    assert run.procs[0].returncode == 0, server
    codes = [p.returncode for p in run.procs[1:]]
    assert [c != 0 for c in codes] == [k == VICTIM for k in range(W)], (codes, server)
    workers = {w["worker"]: w for w in summary["workers"]}
    lost = [k for k, w in workers.items() if w["state"] == "lost"]
    assert lost == [VICTIM], summary
    if lost_applied is not None:
        assert workers[VICTIM]["applied"] == lost_applied, workers[VICTIM]
    assert (0 < workers[VICTIM]["at_update"] < UPDATES) == seen_mid_run, workers[VICTIM]
    assert f"worker {VICTIM} lost" in server and f"lost: worker {VICTIM} after" in server
    for k, w in workers.items():
        if k != VICTIM:
            assert w["reported"]["updates"] == w["applied"] > 0, w
            assert w["reported"]["last_loss"] < 0.5 * w["reported"]["first_loss"], w
    assert summary["counter"] == UPDATES + W - 1, summary
    assert UPDATES - sum(w["applied"] for w in workers.values()) in torn, summary
    final = load_checkpoint(summary["checkpoint"]).params
    assert np.isfinite(final).all()
    assert summary["test_loss"] < 0.7 * summary["first_test_loss"], summary


def test_a_member_killed_mid_accumulate_and_the_survivors_take_its_share(tmp_path, data):
    # the victim SIGKILLs itself in its update KILL_AT, its accumulate posted, not flushed
    run = Run(tmp_path, data, fault=f"step={KILL_AT},kind=kill")
    summary = run.close()
    assert "its process ended" in summary["workers"][VICTIM]["why"]
    _check_end(run, summary, KILL_AT, torn=(1,))


def test_a_member_s_mpiexec_killed_mid_accumulate(tmp_path, data):
    # the victim stops itself in its update KILL_AT, its accumulate posted; the test SIGKILLs
    # its whole mpiexec while it is stopped
    run = Run(tmp_path, data, fault=f"step={KILL_AT},kind=stop")
    victim = run.procs[1 + VICTIM]
    _until("the victim to stop", lambda: _stopped(_tree(victim.pid)), run.procs)
    os.killpg(victim.pid, signal.SIGKILL)
    summary = run.close()
    _check_end(run, summary, KILL_AT, torn=(1,))


def test_a_member_s_mpiexec_killed_at_any_moment_mid_run(tmp_path, data):
    run = Run(tmp_path, data)
    _until("a third of the updates", lambda: max([r["updates"] for r in _records(run.log)
                                                    if r["kind"] == "step"], default=0)
           >= UPDATES // 3, run.procs)
    os.killpg(run.procs[1 + VICTIM].pid, signal.SIGKILL)
    summary = run.close()
    _check_end(run, summary, None, torn=(0, 1))


def test_a_silent_member_is_dropped_after_the_stall_timeout_and_ends_itself(tmp_path, data):
    # the victim stops in its update KILL_AT and is never killed: the others finish the run,
    # the coordinator drops it --stall-timeout after, and once continued it ends on its own
    run = Run(tmp_path, data, fault=f"step={KILL_AT},kind=stop", stall_s=5)
    victim = run.procs[1 + VICTIM]
    _until("the victim to stop", lambda: _stopped(_tree(victim.pid)), run.procs)
    run.wait([p for p in run.procs if p is not victim])
    tree = _tree(victim.pid)
    for pid in tree:
        os.kill(pid, signal.SIGCONT)
    summary = run.close()
    why = summary["workers"][VICTIM]["why"]
    assert "--stall-timeout 5 s, and the run's updates are all taken" in why, why
    assert "the coordinator" in run.text(1 + VICTIM) and "has ended" in run.text(1 + VICTIM)
    _check_end(run, summary, KILL_AT, torn=(1,), seen_mid_run=False)



def test_a_member_killed_while_the_windows_are_made_ends_the_run_in_one_line(tmp_path, data):
    # the windows are made collectively over every member: a death there cannot be survived,
    # so the ring's set-up guard ends the coordinator after --no-worker-timeout, and the
    # members with it
    run = Run(tmp_path, data, fault="phase=making the hogwild windows,kind=kill", no_worker_s=10)
    run.wait()
    for f in run.files:
        f.close()
    for p in run.procs:
        with pytest.raises(ProcessLookupError):
            os.killpg(p.pid, 0)
    assert all(p.returncode != 0 for p in run.procs), [p.returncode for p in run.procs]
    lines = [line for line in run.text(0).splitlines() if line.startswith("psgd: error:")]
    assert len(lines) == 1 and "the workers did not all start within 10 s" in lines[0], lines
    for k in range(W):
        if k != VICTIM:
            assert "the coordinator" in run.text(1 + k) and "has ended" in run.text(1 + k)
