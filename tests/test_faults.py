"""A failure on any rank ends the whole job quickly, naming the rank, under every protocol (PSGD_X_FAULT)."""
import os
import re
import time
import uuid

import pytest
from conftest import wait_marked_gone

from psgd.mpi.faults import parse
from psgd.protocols import PROTOCOLS
from psgd.run.metrics import read_log

MLP = "mlp:784-32-10"
BOUND_S = 30          # a failed job must be gone within this many seconds


def layout(protocol: str) -> tuple[int, int, int, str]:
    """(ranks, servers, the first non-lead worker's rank, optimizer) of the entry's example run."""
    run = PROTOCOLS[protocol].example_run()
    return run["ranks"], run["servers"], run["servers"] + 1, run["optimizer"]


LAYOUT = {name: layout(name) for name in PROTOCOLS}


def run_job(mpirun, dataset, protocol, fault, *flags, timeout=90, env=None):
    """Train under ``protocol`` with ``PSGD_X_FAULT=fault`` (and ``env``); return (proc, seconds,
    leftover pids)."""
    ranks, servers, _, opt = layout(protocol)
    marker = uuid.uuid4().hex
    env = {**(env or {}), "PSGD_X_TEST_MARK": marker}
    if fault:
        env["PSGD_X_FAULT"] = fault
    t0 = time.monotonic()
    proc = mpirun(ranks, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--model", MLP,
                          "--protocol", protocol, "--servers", servers, "--optimizer", opt,
                          "--lr", "0.05", "--batch-size", 16, "--steps", 40, *flags],
                  timeout=timeout, check=False, env=env)
    elapsed = time.monotonic() - t0
    return proc, elapsed, wait_marked_gone(marker, 5)


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("psgd: error:")]


CASES = [(p, "worker", kind) for p in LAYOUT for kind in ("raise", "kill")]
CASES += [(p, "server", "raise") for p in LAYOUT if LAYOUT[p][1]]


def test_a_numpy_error_on_a_rank_reads_as_a_bug_naming_the_rank(mpirun, dataset):
    """Not as a bad flag: numpy's ValueError is no UsageError."""
    proc, _, left = run_job(mpirun, dataset, "bsp", "rank=2,step=5,kind=numpy")
    assert proc.returncode != 0 and not left
    errors = _errors(proc.stderr)
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("psgd: error: rank 2: this is a bug in psgd: ValueError: operands "
                                "could not be broadcast together"), proc.stderr
    path = errors[0].split("(traceback in ")[1].split(";")[0]
    assert "faults.py" in open(path).read()
    os.unlink(path)


@pytest.mark.parametrize("protocol, where, kind", CASES)
def test_failed_rank_ends_job_quickly_and_is_named(mpirun, dataset, protocol, where, kind):
    check_failed_rank(mpirun, dataset, protocol, where, kind)


def check_failed_rank(mpirun, dataset, protocol, where, kind, env=None):
    """A fault (``kind``) on a ``where`` rank ends the job within BOUND_S, naming the rank."""
    rank = 0 if where == "server" else layout(protocol)[2]
    proc, elapsed, left = run_job(mpirun, dataset, protocol, f"rank={rank},step=5,kind={kind}",
                                  env=env)
    assert proc.returncode != 0, proc.stderr
    assert elapsed < BOUND_S, (elapsed, proc.stderr)
    assert not left, f"processes left behind: {left}"
    assert "Traceback" not in proc.stderr
    if kind == "raise":
        errors = _errors(proc.stderr)
        assert len(errors) == 1, proc.stderr
        # an exception psgd did not expect reads as a bug, its traceback in a file
        assert errors[0].startswith(f"psgd: error: rank {rank}: this is a bug in psgd: "
                                    f"InjectedFault"), proc.stderr
        assert f".rank{rank}.traceback; --debug prints it)" in errors[0], proc.stderr
    else:
        # a killed process says nothing, and MPICH names a pid (not always the killed one's,
        # when several die together): the injector's line names the rank and its pid
        assert re.search(rf"PSGD_X_FAULT: rank {rank} \(pid \d+\) at step \d+: kill", proc.stderr)
        assert "BAD TERMINATION" in proc.stdout + proc.stderr
        assert "Killed (signal 9)" in proc.stdout + proc.stderr


@pytest.mark.parametrize("protocol", ["bsp"])
def test_nan_push_is_rejected_by_the_server(mpirun, dataset, protocol):
    proc, elapsed, left = run_job(mpirun, dataset, protocol, "rank=2,step=5,kind=nan")
    assert proc.returncode != 0 and elapsed < BOUND_S and not left
    errors = _errors(proc.stderr)
    assert len(errors) == 1, proc.stderr
    assert "rank 0: push from rank 2 for clock 5 holds non-finite values" in errors[0]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("protocol, rank, message", [
    ("hogwild", 2, "rank 2: hogwild worker 1: the update at clock 5 holds NaN or Inf"),
    ("allreduce", 1, "the averaged gradient of clock 5 holds NaN or Inf"),
    ("gossip", 1, "rank 1: the gradient of clock 5 on worker 1 holds NaN or Inf"),
    ("adpsgd", 1, "rank 1: the gradient of clock 5 on worker 1 holds NaN or Inf"),
])
def test_nan_update_is_rejected_without_servers_in_the_way(mpirun, dataset, protocol, rank,
                                                           message):
    proc, elapsed, left = run_job(mpirun, dataset, protocol, f"rank={rank},step=5,kind=nan")
    assert proc.returncode != 0 and elapsed < BOUND_S and not left
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and message in errors[0], proc.stderr


@pytest.mark.parametrize("protocol", ["asp", "hogwild", "allreduce", "gossip", "adpsgd"])
def test_nan_is_skipped_and_counted_with_skip_nonfinite(mpirun, dataset, tmp_path, protocol):
    rank = LAYOUT[protocol][2]
    log = tmp_path / "log.jsonl"
    proc, _, left = run_job(mpirun, dataset, protocol, f"rank={rank},step=5,kind=nan",
                            "--skip-nonfinite", "--log", log)
    assert proc.returncode == 0, proc.stderr
    assert not left
    summary = read_log(log)[-1]
    assert summary["kind"] == "summary" and summary["skipped_updates"] == 1
    assert summary["test_loss"] == summary["test_loss"]  # finite: the NaN was never applied


@pytest.mark.parametrize("protocol, waits_for", [
    ("ssp", "worker rank(s) [2] to push clock"),
    ("hogwild", "hogwild worker rank(s) [2] to finish their steps"),
    ("allreduce", "rank 1 (shared-memory all-reduce of clock 5)"),
])
def test_hung_rank_is_reported_then_the_job_ends(mpirun, dataset, protocol, waits_for):
    rank = LAYOUT[protocol][2]
    proc, elapsed, left = run_job(mpirun, dataset, protocol, f"rank={rank},step=5,kind=hang",
                                  "--stall-timeout", 1, "--stall-abort", 4)
    assert proc.returncode != 0 and not left
    assert elapsed < BOUND_S, (elapsed, proc.stderr)
    assert re.search(r"psgd: rank \d+ stalled: waiting \d+ s for " + re.escape(waits_for),
                     proc.stderr), proc.stderr
    # every waiting rank reaches the abort limit at about the same time: one or more lines
    errors = _errors(proc.stderr)
    assert errors and all("stall abort limit 4 s" in e for e in errors), proc.stderr


def test_fault_spec_is_parsed_and_checked():
    f = parse("rank=2,step=5,kind=kill")
    assert (f.rank, f.step, f.kind) == (2, 5, "kill")
    for bad in ("rank=x", "rank=1,kind=explode", "rank=1,when=3", "nonsense"):
        with pytest.raises(ValueError, match="PSGD_X_FAULT"):
            parse(bad)
    os.environ.pop("PSGD_X_FAULT", None)
    from psgd.mpi.faults import for_rank
    assert for_rank(0) is None


def test_hogwild_run_longer_than_stall_abort_is_not_a_stall(mpirun, dataset, tmp_path):
    """Hogwild servers wait out the whole training; only updates stopping counts as a stall."""
    log = tmp_path / "log.jsonl"
    proc, _, left = run_job(mpirun, dataset, "hogwild", None, "--steps", 800,
                            "--model", "mlp:784-512-512-10", "--stall-timeout", 1,
                            "--stall-abort", 1.5, "--log", log,
                            "--straggler", "all:p=1,d=0.003")
    assert proc.returncode == 0 and not left, proc.stderr
    # trained for longer than the abort limit: 3 ms a step holds 800 steps past 2.4 s
    # however fast the fused hogwild path gets
    assert read_log(log)[-1]["wall_s"] > 1.5
