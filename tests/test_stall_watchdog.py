"""A rank frozen (SIGSTOP) in any set-up or teardown phase is named with its phase, and the job ends.

Each case freezes one rank on entering one phase (``PSGD_X_FAULT=rank=R,phase=P,kind=stop``)
and checks that the job ends, non-zero, within the stall abort limit + 10 s of the
freeze, with a ``psgd: error:`` line naming the frozen rank and that phase, and that
it leaves no process and nothing in /dev/shm behind.
"""
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import marked_pids, mpiexec_path, shm_left

from psgd.mpi import faults, phase, watchdog

TIMEOUT_S, ABORT_S = 1, 3
BOUND_S = ABORT_S + 10     # from the freeze to the end of the job
# protocol -> (ranks, servers)
LAYOUT = {"bsp": (3, 1), "ssp": (3, 1), "hogwild": (3, 1), "allreduce": (2, 0),
          "gossip": (3, 0), "adpsgd": (2, 0)}
COMMON = ["agreeing on the settings", "agreeing on the run id", "splitting into servers and workers",
          "agreeing that every rank could build the job", "setting up the stop notices"]
END = ["agreeing where training ended", "final gather", "finishing"]
LEAD = ["taking the final parameters"]   # the lead worker (rank S) and, with servers, rank 0
WORKER = ["making the worker", "starting the protocol", "finishing the protocol"]
# family -> (server phases, worker phases), beyond COMMON and END
FAMILY = {
    "ps": (["making the push window", "gathering the final shards", "freeing the push window"],
           ["making the push window", "first pull", "freeing the push window"]),
    "hogwild": (["making the hogwild windows", "publishing the initial parameters",
                 "freeing the hogwild windows", "gathering the final shards"],
                ["making the hogwild windows", "freeing the hogwild windows"]),
    "allreduce": ([], ["making the all-reduce communicators", "making the all-reduce shared window",
                       "making an all-reduce schedule", "freeing the all-reduce state"]),
    "gossip": ([], []),
}
FAMILY_OF = {"bsp": "ps", "ssp": "ps", "hogwild": "hogwild", "allreduce": "allreduce",
             "gossip": "gossip", "adpsgd": "gossip"}


def phases_of(protocol: str, rank: int) -> list[str]:
    """The phases ``rank`` goes through under ``protocol`` after the common set-up."""
    ranks, servers = LAYOUT[protocol]
    server, worker = FAMILY[FAMILY_OF[protocol]]
    if rank < servers:
        own = server + (LEAD if rank == 0 else [])
    else:
        own = WORKER + worker + (LEAD if rank == servers and servers else [])
    return own + END


def cases():
    """Every (protocol, rank, phase); the common set-up phases under ssp only (they are the
    same code under every protocol)."""
    out = [("ssp", r, p) for r in range(LAYOUT["ssp"][0]) for p in COMMON]
    for protocol, (ranks, _) in LAYOUT.items():
        out += [(protocol, r, p) for r in range(ranks) for p in phases_of(protocol, r)]
    return out


# one per protocol family (and the issue's own case), run by default; the rest are slow
FAST = {("ssp", 2, "making the push window"), ("ssp", 0, "agreeing on the run id"),
        ("bsp", 2, "final gather"), ("hogwild", 0, "making the hogwild windows"),
        ("allreduce", 1, "making the all-reduce communicators"),
        ("gossip", 1, "finishing the protocol"), ("adpsgd", 0, "starting the protocol")}
MATRIX = [pytest.param(*c, marks=() if c in FAST else pytest.mark.slow,
                       id=f"{c[0]}-rank{c[1]}-{c[2].replace(' ', '_')}") for c in cases()]


def run_frozen(dataset, protocol: str, rank: int, label: str):
    """Train with ``rank`` stopping itself on entering ``label``; returns (rc, stderr lines,
    seconds from the freeze to the end or None, processes left, (the /dev/shm files the job's
    ranks mapped at the freeze, those of them left behind))."""
    ranks, servers = LAYOUT[protocol]
    marker = f"watchdog-{os.getpid()}-{time.monotonic_ns()}"
    shm_before = set(os.listdir("/dev/shm"))
    opt = "sgd" if protocol == "hogwild" else "momentum"
    cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "psgd", "train", "--data",
           dataset, "--model", "mlp:784-32-10", "--protocol", protocol, "--servers", str(servers),
           "--optimizer", opt, "--steps", "20", "--batch-size", "16", "--quiet",
           "--stall-timeout", str(TIMEOUT_S), "--stall-abort", str(ABORT_S)]
    env = dict(os.environ, PSGD_X_TEST_MARK=marker, PYTHONUNBUFFERED="1",
               PSGD_X_FAULT=f"rank={rank},phase={label},kind=stop")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    lines, frozen_at, mapped = [], [], set()

    def read():
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if line.startswith("psgd: PSGD_X_FAULT:") and not frozen_at:
                frozen_at.append(time.monotonic())
                mapped.update(_shm_mapped_by(marked_pids(marker, ranks_only=True)))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    reader.join()
    ended = time.monotonic()
    deadline = time.monotonic() + 5   # the launcher may return before its ranks are reaped
    while (left := marked_pids(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:   # a frozen rank the launcher did not reach: do not leave it behind
        os.kill(pid, 9)
    # this job's own segments (other jobs on a shared machine may leave theirs meanwhile)
    shm = sorted(name for name in shm_left(shm_before) if name in mapped)
    for name in shm:
        Path("/dev/shm", name).unlink(missing_ok=True)
    return (proc.returncode, lines, (ended - frozen_at[0]) if frozen_at else None, left,
            (sorted(mapped), shm))


def _shm_mapped_by(pids) -> set:
    """The /dev/shm files that the processes ``pids`` map."""
    names = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        names.update(line.rsplit("/dev/shm/", 1)[1].split()[0] for line in maps
                     if "/dev/shm/" in line)
    return names


@pytest.mark.parametrize("protocol, rank, label", MATRIX)
def test_frozen_rank_is_named_with_its_phase_and_the_job_ends(dataset, protocol, rank, label):
    rc, lines, after_freeze, left, (mapped, shm) = run_frozen(dataset, protocol, rank, label)
    text = "\n".join(lines)
    assert f'PSGD_X_FAULT: rank {rank} (pid' in text and f'in phase "{label}": stop' in text, text
    assert rc != 0, text
    assert after_freeze is not None and after_freeze < BOUND_S, (after_freeze, text)
    named = re.compile(rf'rank {rank} does not answer .*last heard entering phase "{re.escape(label)}"')
    errors = [line for line in lines if line.startswith("psgd: error:")]
    assert any(named.search(line) for line in errors), text
    assert not left, f"processes left behind: {left}\n{text}"
    assert mapped, "no rank was seen mapping shared memory: the check below would be empty"
    assert not shm, f"left in /dev/shm: {shm}\n{text}"


def test_the_matrix_covers_every_protocol_rank_and_phase_family():
    found = cases()
    assert {p for p, _, _ in found} == set(LAYOUT)
    for protocol, (ranks, _) in LAYOUT.items():
        assert {r for p, r, _ in found if p == protocol} == set(range(ranks))
        assert {"final gather", "finishing"} <= {x for p, _, x in found if p == protocol}
    assert all(c in found for c in FAST)


# ---------------------------------------------------------------- no MPI job


def test_phases_nest_and_the_innermost_is_current():
    assert phase.current().label == ""
    with phase.phase("outer", watch=False):
        outer = phase.current()
        assert (outer.label, outer.watched) == ("outer", False)
        with phase.phase("inner"):
            inner = phase.current()
            assert (inner.label, inner.watched) == ("inner", True)
            assert inner.seq != outer.seq and inner.since >= outer.since
        assert phase.current().label == "outer"
    assert phase.current().label == ""


def test_a_beat_restarts_the_clock_of_the_phase():
    with phase.phase("long"):
        first = phase.current()
        time.sleep(0.01)
        phase.beat()
        assert phase.current().since > first.since and phase.current().seq != first.seq
        assert phase.current().label == "long"


def test_every_phase_change_is_announced_and_a_watched_wait_is_noted():
    heard = []
    phase.listen(heard.append, lambda: "; peers")
    try:
        assert not phase.covered(lambda: "x")   # no timed phase: the wait reports itself
        with phase.phase("a"):
            assert phase.covered(lambda: "rank 3 to say hello")
            assert phase.waiting_for() == "rank 3 to say hello"
            with phase.phase("b", watch=False):
                assert not phase.covered(lambda: "y")
            assert phase.waiting_for() is None   # noted in another phase
        assert phase.peers() == "; peers"
    finally:
        phase.listen(None)
    assert heard == ["a", "b", "a", ""]
    assert phase.peers() == ""


def test_a_phase_fault_parses_and_fires_only_on_its_phase(monkeypatch):
    fault = faults.parse("rank=2,phase=making the push window,kind=stop")
    assert (fault.rank, fault.phase, fault.kind) == (2, "making the push window", "stop")
    fault.at(10 ** 6)       # a training step: not this fault's
    fault.at_phase("first pull")
    assert not fault.fired
    stopped = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: stopped.append(sig))
    fault.at_phase("making the push window")
    fault.at_phase("making the push window")
    assert stopped == [faults.signal.SIGSTOP]
    with pytest.raises(ValueError, match="rank=R,phase=LABEL"):
        faults.parse("rank=2,where=x")
    assert faults.parse("rank=1,phase=a, b and c,kind=hang").phase == "a, b and c"


def test_the_report_names_silent_ranks_with_their_last_phase_else_the_others():
    now = time.monotonic()
    heard = {0: ("", now, False), 1: ("first pull", now - 7, True),
             2: ("making the push window", now - 3, True), 3: ("training", now - 9, False)}
    text = watchdog.describe_peers([2], heard, {}, "making the push window")
    assert text.startswith("; rank 2 does not answer")
    assert 'last heard entering phase "making the push window" 3 s ago' in text
    answers = {1: ("first pull", 4.0, now), 2: ("making the push window", 1.0, now)}
    text = watchdog.describe_peers([], heard, answers, "making the push window")
    assert text == '; the others answer: rank 1 in "first pull" for 4 s'
    assert watchdog.describe_peers([], heard, {1: ("x", 1.0, now)}, "x") == \
        "; every rank answers, in the same phase"
    # a rank in the training loop does not answer (its watchdog makes no MPI call there)
    text = watchdog.describe_peers([2, 3], heard, {}, "making the push window")
    assert "rank 2 does not answer" in text and "rank 3 does not answer" not in text
    assert text.endswith('; rank 3 in "training" since 9 s')


def test_labels_travel_whole_up_to_their_length():
    label = "making the push window"
    assert watchdog._unpack(watchdog._pack(label, 2.5)) == (label, 2.5)
    long = "x" * (watchdog.LABEL_BYTES + 10)
    assert watchdog._unpack(watchdog._pack(long))[0] == long[:watchdog.LABEL_BYTES]


def test_mpi4py_releases_the_gil_in_every_blocking_setup_call(mpirun):
    """The watchdog thread runs while the main thread is blocked in any of these calls, and may
    call MPI (MPI_Abort) itself: MPI runs with MPI_THREAD_MULTIPLE."""
    out = mpirun(2, ["gil_release_check.py"], timeout=90).stdout
    rows = dict(re.findall(r"^(\w+) blocked .*ticks (\d+)$", out, re.M))
    assert set(rows) == {"Barrier", "Bcast", "Allgather", "Split_type", "Comm_split", "Comm_dup",
                         "Win_allocate_shared", "Win_allocate", "Win_create",
                         "Dist_graph_create_adjacent", "Win_free"}, out
    for name, ticks in rows.items():   # 0.6 s late at 10 ms a tick: ~60 with the GIL free
        assert int(ticks) >= 20, f"the GIL is held in {name}:\n{out}"
    assert "threads: multiple" in out, out
