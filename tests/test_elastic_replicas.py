"""Server replicas (--replicas 2): a backup server that follows the primary's updates and takes
over when the server job is SIGKILLed (psgd.elastic.replica; docs/design/elastic.md)."""
import glob
import os
import signal
import zlib

import numpy as np
import pytest
from conftest import run_mpi
from test_elastic import Run, _records, _tree, _until, data  # noqa: F401 - data: a fixture

from psgd.elastic import _mapped_by_mine
from psgd.elastic.replica import KILL, TRACE, segments_of
from psgd.run.checkpoint import load_checkpoint

pytestmark = pytest.mark.mpi

UPDATES = 1200
LR = 0.05


def _segments() -> set:
    return set(glob.glob("/dev/shm/mpich_shm_*"))


def _segments_of_job(pid: int) -> set:
    """The MPICH segments the processes of the job whose mpiexec is ``pid`` map."""
    return {path for p in _tree(pid) for path in segments_of(p)}


def _replicated(tmp_path, data, protocol="asp", extra=(), kill_at=0.4, env=None,
                worker_kill_at=None):
    """A replicated run whose server job is SIGKILLed at ``kill_at`` of the updates (or, with
    ``env`` PSGD_X_REPLICA_KILL, kills itself mid-forward), and worker 0's job at
    ``worker_kill_at`` before that; its jobs, outputs and records."""
    before, doomed = _segments(), set()
    env = {TRACE: str(tmp_path), **(env or {})}
    run = Run(tmp_path, data, UPDATES, protocol=protocol, env=env,
              extra=["--replicas", 2, "--checkpoint-dir", tmp_path / "ckpt", *extra])
    backup = run._job("backup", ["join", "--port-file", run.port, "--backup"],
                      env={TRACE: str(tmp_path)})
    _until("the backup to join", lambda: "backup server of run" in run.output("backup"),
           run.procs)
    workers = [run.join(0), run.join(1)]
    if worker_kill_at is not None:
        _until(f"{worker_kill_at:.0%} of the updates",
               lambda: run.updates() >= worker_kill_at * UPDATES, run.procs)
        doomed = _segments_of_job(workers[0].pid)
        os.killpg(workers[0].pid, signal.SIGKILL)
        _until("the primary to drop the killed worker", lambda: " lost: " in run.output("server"),
               run.procs)
    if kill_at is not None:
        _until(f"{kill_at:.0%} of the updates", lambda: run.updates() >= kill_at * UPDATES,
               run.procs)
        os.killpg(run.server.pid, signal.SIGKILL)
    killed, run.server = run.server, backup   # the run's summary is the backup's
    summary = run.finish()   # every job ended within the deadline, the backup with 0
    assert killed.returncode != 0
    codes = [w.returncode for w in workers]
    assert codes[1] == 0 and (codes[0] != 0) == bool(worker_kill_at), \
        [run.output(f"joiner{k}") for k in (0, 1)]
    # the killed primary's segment too (the backup unlinks it); other jobs' may be running;
    # a SIGKILLed worker's, the primary unlinks when it drops it (its knock named its pid)
    assert not [path for path in doomed if os.path.exists(path)], doomed
    left = _segments() - before - _mapped_by_mine()
    assert not left, f"a job left its MPICH segment in /dev/shm: {left}\n{run.output('backup')}"
    assert len([r for r in _records(run.log) if r["kind"] == "summary"]) == 1
    return run, summary


def _check_replay(tmp_path, summary):
    """The backup's parameters at the takeover equal the primary's after the same update, its
    applied updates begin with the primary's in the same order, and its final parameters
    equal a float64 replay of them (sgd: p -= lr * g)."""
    n_taken, crc = np.load(tmp_path / "takeover.npy")
    lines = open(tmp_path / "primary.trace").read().split("\n")[:-1]   # whole lines only
    primary = [tuple(map(int, line.split())) for line in lines]
    by_n = {n: (w, c, x) for n, w, c, x in primary}
    assert by_n[n_taken][2] == crc   # the backup = the primary at its last forwarded update
    init = np.load(tmp_path / "init.npy")
    raw = open(tmp_path / "backup.bin", "rb").read()
    step = 32 + 4 * init.size
    assert len(raw) % step == 0
    p = init.astype(np.float64)
    order = []
    for i in range(0, len(raw), step):
        n, w, c, stale = np.frombuffer(raw, np.int64, 4, i)
        order.append((int(n), int(w), int(c), int(stale)))
        p -= LR * np.frombuffer(raw, np.float32, init.size, i + 32).astype(np.float64)
    assert [o[0] for o in order] == list(range(1, len(order) + 1))
    assert [(w, c) for _, w, c, _ in order[:n_taken]] == \
        [by_n[n][:2] for n in range(1, n_taken + 1)]
    assert len(order) == summary["updates"]
    final = load_checkpoint(summary["checkpoint"]).params
    np.testing.assert_allclose(final, p, rtol=0, atol=2e-5)
    return int(n_taken), order, primary


@pytest.mark.slow
def test_the_backup_takes_over_a_killed_server_job_and_the_run_finishes(tmp_path, data):
    run, summary = _replicated(tmp_path, data)
    lost = summary["servers_lost"]
    assert len(lost) == 1 and lost[0]["server"] == "primary", lost
    assert "has ended" in lost[0]["why"] and lost[0]["at_s"] > 0
    assert summary["updates"] >= UPDATES
    n_taken, order, primary = _check_replay(tmp_path, summary)
    assert 0.4 * UPDATES <= n_taken <= len(primary)
    for k in (0, 1):
        assert "re-routing to the backup" in run.output(f"joiner{k}")
    assert "the backup takes over" in run.output("backup")
    # both came over the standby links they made when they joined: no accept after the death
    rerouted = [r for r in _records(run.log) if r["kind"] == "rerouted"]
    assert sorted((r["worker"], r["how"]) for r in rerouted) == \
        [(0, "its standby link"), (1, "its standby link")], rerouted
    assert not glob.glob(f"{run.port}.standby*"), "the backup left its standby door's files"
    assert {w["state"] for w in summary["workers"]} == {"done"}


@pytest.mark.slow
def test_a_server_killed_mid_forward_loses_only_the_half_sent_update(tmp_path, data):
    at = UPDATES // 2
    run, summary = _replicated(tmp_path, data, kill_at=None, env={KILL: str(at)})
    n_taken, order, primary = _check_replay(tmp_path, summary)
    # the primary applied update `at` and sent its header, never its gradient
    assert n_taken == at - 1 and primary[-1][0] == at, (n_taken, primary[-1])
    assert "without its whole gradient" in summary["servers_lost"][0]["why"]


@pytest.mark.slow
def test_a_worker_lost_before_the_takeover_stays_lost_and_the_other_reroutes(tmp_path, data):
    run, summary = _replicated(tmp_path, data, worker_kill_at=0.2, kill_at=0.5)
    states = sorted(w["state"] for w in summary["workers"])
    assert states == ["done", "lost"], summary["workers"]
    lost = next(w for w in summary["workers"] if w["state"] == "lost")
    # dropped by the primary before its loss, and the drop forwarded to the backup
    assert lost["left_at"] <= summary["servers_lost"][0]["updates"], (lost, summary["servers_lost"])
    n_taken, order, _ = _check_replay(tmp_path, summary)
    assert not [o for o in order[n_taken:] if o[1] == lost["worker"]]   # nothing of it after


@pytest.mark.slow
def test_ssp_keeps_its_bound_across_the_takeover(tmp_path, data):
    s = 2
    run, summary = _replicated(tmp_path, data, protocol="ssp", extra=["--staleness", s])
    n_taken, order, _ = _check_replay(tmp_path, summary)
    assert max(stale for *_, stale in order) <= s
    hist = summary["staleness_histogram"]
    assert not any(hist[s + 1:]), hist


@pytest.mark.parametrize("argv, message", [
    (["--elastic", "--protocol", "bsp"], "--replicas 2 runs --elastic --protocol ssp or asp"),
    (["--elastic", "--protocol", "hogwild"], "--replicas 2 runs --elastic --protocol ssp or asp"),
    (["--protocol", "asp", "--no-port"], "--replicas applies with --elastic only"),
    (["--elastic", "--protocol", "asp", "--servers", "2"], "one server rank"),
    (["--elastic", "--protocol", "asp", "--replicas", "3"], "--replicas is 1 or 2"),
    (["--elastic", "--protocol", "asp", "--resume", "auto", "--checkpoint-dir", "ck"],
     "--replicas 2 does not resume"),
])
def test_what_is_not_built_is_refused_in_one_line(data, argv, message):
    port = [] if "--no-port" in argv else ["--port-file", "p"]
    argv = ["train", "--data", data, "--model", "mlp:784-10", "--optimizer", "sgd", *port,
            "--replicas", "2", *(a for a in argv if a != "--no-port")]
    result = run_mpi(1, ["-m", "psgd", *argv], timeout=60, check=False)
    lines = [line for line in result.stderr.splitlines() if line.startswith("psgd")]
    assert result.returncode != 0 and len(lines) == 1 and message in lines[0], result.stderr
