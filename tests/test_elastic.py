"""Elastic asp, ssp and bsp: a server job that worker jobs join and leave (docs/guide/elastic.md).

Every job is its own ``mpiexec -n 1``, started in a session of its own so that a SIGKILL of
its process group kills exactly that job, and every wait has a deadline.
"""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import ROOT, mpiexec_path, run_mpi, write_synth

from psgd.run.checkpoint import load_checkpoint

pytestmark = pytest.mark.mpi

UPDATES = 3000
DEADLINE_S = 150


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_synth(tmp_path_factory.mktemp("elastic") / "synth.h5", 2000, 500)


def _start(args: list, out, ranks: int = 1, env=None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", PSGD_STALL_ABORT="120", **(env or {}))
    cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "psgd", *map(str, args)]
    return subprocess.Popen(cmd,
                            stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env,
                            start_new_session=True)


def _records(log) -> list:
    if not os.path.exists(log):
        return []
    with open(log, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.endswith("\n")]


def _until(what: str, test, procs: list, timeout: float = 60.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        found = test()
        if found:
            return found
        time.sleep(0.05)
    _kill(procs)
    pytest.fail(f"waited {timeout:.0f} s for {what}")


def _kill(procs: list) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)


class Run:
    """A server job and its joiners, with their output files under ``tmp``."""

    def __init__(self, tmp, data, updates: int = UPDATES, extra=(), protocol="asp",
                 servers: int = 1, env=None) -> None:
        self.tmp, self.port, self.log = tmp, tmp / "port", tmp / "log.jsonl"
        self.procs, self.outs, self.names = [], [], []
        self.server = self._job("server", [
            "train", "--elastic", "--protocol", protocol, "--servers", servers, "--data", data,
            "--model", "mlp:784-64-10", "--optimizer", "sgd", "--lr", "0.05",
            "--steps", updates, "--port-file", self.port, "--stall-timeout", "3",
            "--no-worker-timeout", "20", "--log", self.log, "--log-every", "50", *extra],
            ranks=servers, env=env)
        _until("the port file", self.port.exists, self.procs)

    def _job(self, name: str, args: list, ranks: int = 1, env=None) -> subprocess.Popen:
        out = open(self.tmp / f"{name}.out", "w")
        self.outs.append(out)
        self.names.append(name)
        proc = _start(args, out, ranks, env)
        self.procs.append(proc)
        return proc

    def join(self, k: int, env=None) -> subprocess.Popen:
        """Start joiner ``k`` (``env``: more environment, e.g. a PSGD_X_FAULT of its own)."""
        return self._job(f"joiner{k}", ["join", "--port-file", self.port], env=env)

    def updates(self) -> int:
        steps = [r["updates"] for r in _records(self.log) if r["kind"] == "step"]
        return max(steps, default=0)

    def finish(self) -> dict:
        """Wait for every job; returns the server's summary record."""
        t0 = time.monotonic()
        for p in self.procs:
            try:
                p.wait(timeout=max(1.0, DEADLINE_S - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                _kill(self.procs)
                job = " ".join(map(str, p.args[3:]))
                pytest.fail(f"a job did not end within {DEADLINE_S} s: {job}\n{self.outputs()}")
        for out in self.outs:
            out.close()
        assert self.server.returncode == 0, self.outputs()
        summary = [r for r in _records(self.log) if r["kind"] == "summary"]
        assert summary, self.outputs()
        return summary[0]

    def output(self, name: str) -> str:
        return (self.tmp / f"{name}.out").read_text()

    def outputs(self) -> str:
        """Every job's output, each under its name (what a failure shows)."""
        return "\n".join(f"--- {name}:\n{self.output(name)}" for name in self.names)


def _pushes(summary: dict) -> dict:
    return {w["worker"]: w for w in summary["workers"]}


def _run(tmp_path, data, kill_at: float | None = None, join_at: float | None = None,
         updates: int = UPDATES, **server) -> tuple:
    run = Run(tmp_path, data, updates, **server)
    first = [run.join(0), run.join(1)]
    if kill_at is not None:   # SIGKILL joiner 0's whole mpiexec job mid-run
        _until(f"{kill_at:.0%} of the updates", lambda: run.updates() >= kill_at * updates,
               run.procs)
        os.killpg(first[0].pid, signal.SIGKILL)
    if join_at is not None:
        _until(f"{join_at:.0%} of the updates", lambda: run.updates() >= join_at * updates,
               run.procs)
        run.join(2)
    return run, run.finish()


@pytest.mark.slow
def test_a_killed_worker_job_is_dropped_and_the_run_reaches_its_accuracy(tmp_path, data):
    (tmp_path / "whole").mkdir()
    (tmp_path / "cut").mkdir()
    _, whole = _run(tmp_path / "whole", data)
    cut_run, cut = _run(tmp_path / "cut", data, kill_at=0.3)
    # the two joiners knock at once, so which slot the killed one got is the order of admission
    states = sorted(w["state"] for w in cut["workers"])
    assert states == ["done", "lost"], cut["workers"]
    lost, done = sorted(cut["workers"], key=lambda w: w["state"] == "done")
    # seen dead at once (its process on this host ended: psgd.elastic.alive), not after
    # --stall-timeout of silence
    assert "lost: its process ended" in cut_run.output("server")
    # the servers count the run's length (a worker's push already on its way when the count
    # is reached is applied too), and every push counted was applied whole
    for summary in (whole, cut):
        assert UPDATES <= summary["updates"] < UPDATES + 2, summary
        assert sum(w["pushes"] for w in summary["workers"]) == summary["updates"]
    assert 0.05 * UPDATES <= lost["pushes"] < 0.4 * UPDATES   # its share of 30 %
    assert lost["left_at"] >= 0.3 * UPDATES and done["left_at"] >= UPDATES
    # the same number of updates from the same distribution; asp's order differs run to run
    # (docs/results/elastic.md: the spread of repeated uninterrupted runs is under 0.02)
    assert cut["test_accuracy"] >= whole["test_accuracy"] - 0.03, (cut, whole)


@pytest.mark.slow
def test_a_worker_that_joins_mid_run_pulls_the_model_and_its_pushes_count(tmp_path, data):
    updates = 4 * UPDATES   # long enough for the joiner to start (a few seconds) and push
    run, summary = _run(tmp_path, data, join_at=0.3, updates=updates)
    workers = _pushes(summary)
    joined = [r for r in _records(run.log) if r["kind"] == "joined" and r["worker"] == 2]
    assert joined and joined[0]["updates"] >= 0.3 * updates, joined
    assert joined[0]["clock"] > 0        # it started at the servers' clock, not at 0
    assert workers[2]["state"] == "done" and workers[2]["pushes"] > 0, workers
    assert sum(w["pushes"] for w in summary["workers"]) == summary["updates"]
    assert updates <= summary["updates"] < updates + 3
    assert "the servers ended the run" in run.output("joiner2")


@pytest.mark.slow
def test_ssp_drops_a_killed_worker_and_the_survivor_keeps_within_the_bound(tmp_path, data):
    s = 2
    run, summary = _run(tmp_path, data, kill_at=0.3, protocol="ssp", extra=["--staleness", s])
    lost, done = sorted(summary["workers"], key=lambda w: w["state"] == "done")
    assert (lost["state"], done["state"]) == ("lost", "done"), summary["workers"]
    assert "lost: its process ended" in run.output("server")
    # the survivor's pulls were held while the lost worker held the version, and answered
    # once it was dropped: no push, before or after, read parameters more than s clocks old
    hist = summary["staleness_histogram"]
    assert sum(hist) == summary["updates"] and not any(hist[s + 1:]), hist
    assert done["pushes"] > 0.6 * UPDATES and done["left_at"] >= UPDATES
    assert sum(w["pushes"] for w in summary["workers"]) == summary["updates"]


def _serial(log, summary, dtype=np.float64) -> tuple:
    """The run's config record, its model built serially in ``dtype`` from the run's seed, and
    each worker's reader in its slot's order (as `psgd join` reads)."""
    from psgd.data.reader import ShardReader, dataset_info
    from psgd.nn.model import build_model
    config = next(r for r in _records(log) if r["kind"] == "config")
    info = dataset_info(config["data"])
    model = build_model(config["model"], seed=config["seed"], dtype=dtype,
                        input_shape=info["input_shape"], n_classes=info["n_classes"])
    readers = {w["worker"]: ShardReader(config["data"], 0, 1, config["batch_size"],
                                        seed=config["seed"] + 1 + w["worker"])
               for w in summary["workers"]}
    return config, model, readers


def _bsp_reference(log, summary, both: bool = False) -> np.ndarray:
    """Serial float64 SGD of the elastic bsp run in ``log``: at clock c the mean gradient of
    the workers that pushed c (the roster's first..last clock; ``both``: as if no worker had
    left), worker w reading the training set in its slot's order, as `psgd join` does."""
    config, model, readers = _serial(log, summary)
    roster = summary["workers"]
    end = max(w["last_clock"] for w in roster)
    for clock in range(end + 1):
        grads = []
        for w in roster:
            if w["first_clock"] <= clock and (both or clock <= w["last_clock"]):
                model.loss_and_grad(*readers[w["worker"]].batch(clock))
                grads.append(model.grad.copy())
        model.params -= config["lr"] * np.mean(grads, axis=0)
    return model.params


def _bsp_step_errors(log, summary, ckpt) -> list:
    """Each step v -> v + 1 of the elastic bsp run in ``log``, from its checkpoints in ``ckpt``
    (one per update): (v, the largest error of the step against the mean float64 gradient, at
    the parameters it started from, of the workers that pushed clock v, the same as if no
    worker had left). A step at a time, so a ReLU that float32 round-off flips late in the run
    cannot move the whole trajectory away from a serial reference."""
    config, model, readers = _serial(log, summary)
    roster = summary["workers"]
    last = {w["worker"]: w["last_clock"] for w in roster}
    # the parameters after v steps: the initial model's, then the first checkpoint at version v
    versions = {0: _serial(log, summary, np.float32)[1].params.astype(np.float64)}
    for path in sorted(ckpt.glob("ckpt-*.h5")):
        c = load_checkpoint(path)
        versions.setdefault(int(c.clocks[0]), c.params.astype(np.float64))
    errors = []
    for v in sorted(versions)[:-1]:
        step = (versions[v] - versions[v + 1]) / config["lr"]
        grads = {}
        for w in roster:
            if w["first_clock"] <= v:
                model.params[:] = versions[v]
                model.loss_and_grad(*readers[w["worker"]].batch(v))
                grads[w["worker"]] = model.grad.copy()
        pushed = [g for k, g in grads.items() if v <= last[k]]
        errors.append((v, np.abs(step - np.mean(pushed, axis=0)).max(),
                       np.abs(step - np.mean(list(grads.values()), axis=0)).max()))
    return errors


@pytest.mark.slow
def test_bsp_goes_on_with_the_survivor_after_a_worker_is_killed(tmp_path, data):
    ckpt, updates = tmp_path / "ckpt", UPDATES // 10
    run, summary = _run(tmp_path, data, kill_at=0.3, updates=updates, protocol="bsp",
                        extra=["--checkpoint-dir", ckpt, "--lr-schedule", "constant",
                               "--checkpoint-every", "1", "--checkpoint-keep", "0"])
    lost, done = sorted(summary["workers"], key=lambda w: w["state"] == "done")
    assert (lost["state"], done["state"]) == ("lost", "done"), summary["workers"]
    assert not any(summary["staleness_histogram"][1:]), summary["staleness_histogram"]
    # one step per clock: two pushes averaged while both pushed, the survivor's alone after
    # the drop (a barrier that still counted the lost worker would never step again)
    assert summary["steps"] == done["last_clock"] + 1, summary
    assert lost["last_clock"] < done["last_clock"]
    assert sum(w["pushes"] for w in summary["workers"]) == summary["updates"]
    # every step is bsp's: the mean gradient of both workers up to the lost one's last clock,
    # the survivor's alone after it
    errors = _bsp_step_errors(run.log, summary, ckpt)
    assert [v for v, _, _ in errors] == list(range(summary["steps"])), errors
    assert max(e for _, e, _ in errors) < 1e-5, max(errors, key=lambda e: e[1])
    assert all(both > 1e-2 for v, _, both in errors if v > lost["last_clock"])


@pytest.mark.slow
def test_two_servers_drop_a_killed_worker_on_both_shards(tmp_path, data):
    ckpt = tmp_path / "ckpt"
    run, summary = _run(tmp_path, data, kill_at=0.3, servers=2,
                        extra=["--checkpoint-dir", ckpt, "--checkpoint-every", "200"])
    lost, done = sorted(summary["workers"], key=lambda w: w["state"] == "done")
    assert (lost["state"], done["state"]) == ("lost", "done"), summary["workers"]
    assert UPDATES <= summary["updates"] < UPDATES + 2, summary
    assert sum(w["pushes"] for w in summary["workers"]) == summary["updates"]
    # the checkpoints hold both shards, each of which trained on between two of them
    first = load_checkpoint(sorted(ckpt.glob("ckpt-*.h5"))[0])
    last = load_checkpoint(summary["checkpoint"])
    half = last.params.size // 2
    assert last.step > first.step, (first.step, last.step)
    for part in (slice(0, half), slice(half, None)):
        assert (last.params[part] != first.params[part]).mean() > 0.5


def _tree(pid: int) -> list:
    """``pid`` and every process below it (from /proc)."""
    parent = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent[int(entry)] = int(fields[1])
    tree = [pid]
    for p in tree:
        tree += [c for c, pp in parent.items() if pp == p]
    return tree


@pytest.mark.slow
def test_a_stopped_worker_that_was_dropped_is_told_when_it_resumes(tmp_path, data):
    updates = 5 * UPDATES   # the other worker alone must not finish within the stop
    run = Run(tmp_path, data, updates)
    slow, _ = run.join(0), run.join(1)
    _until("5 % of the updates", lambda: run.updates() >= 0.05 * updates, run.procs)
    tree = _tree(slow.pid)   # Hydra starts the rank in a process group of its own
    try:
        for pid in tree:
            os.kill(pid, signal.SIGSTOP)   # alive, but silent past --stall-timeout 3
        _until("the drop", lambda: "lost: silent" in run.output("server"), run.procs, 30)
    finally:
        for pid in tree:
            os.kill(pid, signal.SIGCONT)
    summary = run.finish()
    told = [k for k in (0, 1) if "was dropped by the servers" in run.output(f"joiner{k}")]
    assert len(told) == 1, [run.output(f"joiner{k}") for k in (0, 1)]
    assert run.procs[1 + told[0]].returncode == 3   # psgd.elastic.join.EXIT_DROPPED
    states = {w["worker"]: w["state"] for w in summary["workers"]}
    assert sorted(states.values()) == ["done", "lost"], states
    # what it pushed after the drop was discarded: the count stays the applied updates
    assert sum(w["pushes"] for w in summary["workers"]) == summary["updates"]


@pytest.mark.slow
def test_an_elastic_run_killed_whole_resumes_from_its_checkpoint(tmp_path, data):
    ckpt = tmp_path / "ckpt"
    keep = ["--checkpoint-dir", ckpt, "--checkpoint-every", "100"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = Run(tmp_path / "a", data, extra=keep)
    first.join(0), first.join(1)
    _until("40 % of the updates", lambda: first.updates() >= 0.4 * UPDATES, first.procs)
    _kill(first.procs)   # the servers and every worker: a crash of the whole run
    saved = load_checkpoint(sorted(ckpt.glob("ckpt-*.h5"))[-1])
    second = Run(tmp_path / "b", data, extra=[*keep, "--resume", "auto"])
    second.join(0), second.join(1)
    summary = second.finish()
    assert f"resumed run {saved.run_id}" in second.output("server")
    # the count goes on from the checkpoint's updates, and the workers from its clock
    assert UPDATES <= summary["updates"] < UPDATES + 2, summary
    assert sum(w["pushes"] for w in summary["workers"]) == summary["updates"] - saved.step
    assert min(w["first_clock"] for w in summary["workers"]) == saved.clocks.max()
    assert load_checkpoint(summary["checkpoint"]).run_id == saved.run_id


def _steady(records: list) -> list:
    """A log's records as a run without disturbance would repeat them: kinds and counts, no
    times, paths or run ids."""
    drop = {"run_id", "log", "port_file", "checkpoint_dir", "wall_s", "checkpoint", "time",
            "t", "elapsed_s"}
    return [{k: v for k, v in r.items() if k not in drop} for r in records]


@pytest.mark.slow
def test_a_joiner_with_another_model_is_refused_in_one_line_and_the_run_is_untouched(tmp_path,
                                                                                      data):
    """One worker (so the run is deterministic), and the same run again with a joiner for
    another model knocking mid-run: that joiner is refused in one line before it reaches MPI,
    and the run's log and final parameters are those of the run it did not knock at."""
    updates = 2 * UPDATES   # long enough for the other joiner to start and knock mid-run
    ends = {}
    for name in ("alone", "knocked"):
        (tmp_path / name).mkdir()
        run = Run(tmp_path / name, data, updates,
                  extra=["--checkpoint-dir", tmp_path / name / "ckpt"])
        run.join(0)
        if name == "knocked":
            _until("a fifth of the updates", lambda: run.updates() >= updates // 5, run.procs)
            other = run._job("other", ["join", "--port-file", run.port, "--data", data,
                                       "--protocol", "asp", "--model", "mlp:784-32-10"])
            other.wait(timeout=60)
        ends[name] = (run, run.finish())
    (alone, quiet), (knocked, summary) = ends["alone"], ends["knocked"]
    lines = [line for line in knocked.output("other").splitlines() if line.startswith("psgd")]
    assert other.returncode != 0 and len(lines) == 1, knocked.output("other")
    assert "refused this worker: its --model is mlp:784-32-10, the run's is mlp:784-64-10" \
        in lines[0]
    records = _records(knocked.log)
    kinds = [r["kind"] for r in records]
    assert kinds.count("refused") == 1 and "joined" in kinds[:kinds.index("refused")]
    at = kinds.index("refused")
    assert "step" in kinds[:at] and "step" in kinds[at:], kinds   # it knocked mid-run
    assert "its --model is mlp:784-32-10" in records[at]["why"]
    # nothing else of the run changed: the same records, the same final parameters
    assert _steady(records[:at] + records[at + 1:]) == _steady(_records(alone.log))
    assert summary["updates"] == quiet["updates"] and summary["workers"] == quiet["workers"]
    np.testing.assert_array_equal(load_checkpoint(summary["checkpoint"]).params,
                                  load_checkpoint(quiet["checkpoint"]).params)
    assert "lost:" not in knocked.output("server")
    assert not list(tmp_path.glob("knocked/port*")), "a knock, refusal or port file was left"


def test_a_server_with_no_worker_ends_with_one_line(tmp_path, data):
    run = Run(tmp_path, data, extra=["--no-worker-timeout", "2"])
    try:
        run.server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        _kill(run.procs)
        pytest.fail("the server waited on")
    out = run.output("server")
    assert run.server.returncode == 1, out
    assert "no worker was connected for 2 s" in out
    assert not run.port.exists()


def test_a_job_that_leaves_removes_its_mpich_segment(tmp_path):
    """psgd.elastic.leave ends a job without MPI_Finalize, which alone would unlink the job's
    segment in /dev/shm (1 MiB left per job otherwise)."""
    script = tmp_path / "leave.py"
    script.write_text("from mpi4py import MPI\nfrom psgd.elastic import leave, mapped_segments\n"
                      "print(' '.join(mapped_segments()), flush=True)\nleave(5)\n")
    result = run_mpi(1, [script], timeout=60, check=False)
    segments = result.stdout.split()
    assert result.returncode == 5 and segments, (result.stdout, result.stderr)
    assert not [path for path in segments if os.path.exists(path)]


@pytest.mark.parametrize("argv, message", [
    (["train", "--elastic", "--protocol", "gossip", "--servers", "0", "--optimizer", "sgd"],
     "--elastic runs --protocol bsp or ssp or asp or allreduce or adpsgd or hogwild so far, "
     "not gossip"),
    (["train", "--elastic", "--protocol", "asp", "--port-file", "p", "--tensor", "2"],
     "--elastic runs the whole model on every worker"),
    (["train", "--elastic", "--protocol", "ssp", "--staleness", "auto", "--port-file", "p"],
     "--elastic runs a fixed --staleness s"),
    (["train", "--elastic", "--protocol", "asp", "--optimizer", "momentum", "--replicas", "2",
      "--port-file", "p"], "--replicas 2 runs without --staleness-comp dana"),
    (["train", "--protocol", "asp", "--port-file", "p"], "--port-file applies with --elastic"),
    (["train", "--elastic", "--protocol", "asp"], "--elastic needs --port-file"),
    (["join", "--port-file", "/nonexistent/port"], "--port-file /nonexistent/port: no such file"),
])
def test_bad_elastic_input_gives_one_line(data, argv, message):
    if argv[0] == "train":
        argv = [*argv, "--data", data, "--model", "mlp:784-10"]
    result = run_mpi(1, ["-m", "psgd", *argv], timeout=60, check=False)
    lines = [line for line in result.stderr.splitlines() if line.startswith("psgd")]
    assert result.returncode != 0 and len(lines) == 1 and message in lines[0], result.stderr
    assert "this is a bug" not in lines[0]   # bad input, not a bug
