"""What the MPI under psgd does when a peer dies: the facts docs/design/elastic.md builds on.

If one of these fails after an MPI upgrade, the premise of the elastic design changed: read
the design page again before trusting its conclusions.
"""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from conftest import MPI_DIR, mpiexec_path, wait_marked_gone

pytestmark = [pytest.mark.slow, pytest.mark.mpi]


def _library() -> str:
    out = subprocess.run([sys.executable, "-c", "import mpi4py; mpi4py.rc.initialize = False\n"
                          "from mpi4py import MPI; print(MPI.Get_library_version())"],
                         capture_output=True, text=True, check=True)
    return out.stdout


mpich_only = pytest.mark.skipif("MPICH" not in _library(), reason="pins MPICH's behaviour")


def _launch(args: list, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([mpiexec_path(), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))


def _finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timeout\n--- stdout\n{out}\n--- stderr\n{err}")


@mpich_only
def test_inside_one_hydra_job_a_killed_rank_takes_the_survivors_down_even_without_auto_cleanup():
    proc = _launch(["-disable-auto-cleanup", "-n", 3, sys.executable, MPI_DIR / "peer_death.py", 5])
    out, err = _finish(proc)
    assert proc.returncode != 0, (out, err)
    assert "ALIVE 0" not in out and "RESULT irecv: error" not in out, out   # no error comes back


@mpich_only
def test_mpich_fault_tolerance_mode_fails_at_init_in_the_pypi_build():
    proc = _launch(["-disable-auto-cleanup", "-n", 2, sys.executable, "-c",
                    "from mpi4py import MPI; print('INIT OK')"], env={"MPIR_CVAR_ENABLE_FT": "1"})
    out, err = _finish(proc)
    assert proc.returncode != 0 and "INIT OK" not in out, (out, err)
    assert "Assertion failed" in err, err


def test_a_joiner_job_killed_leaves_the_server_job_running_and_the_next_joiner_is_admitted(tmp_path):
    port, sent = tmp_path / "port", 5
    server = _launch(["-n", 1, sys.executable, MPI_DIR / "port_server.py", port, 3, 2])
    deadline = time.monotonic() + 30
    while not port.exists() and time.monotonic() < deadline and server.poll() is None:
        time.sleep(0.05)
    assert port.exists(), _finish(server)
    for _ in range(2):
        joiner = _launch(["-n", 1, sys.executable, MPI_DIR / "port_joiner.py", port, sent])
        out, err = _finish(joiner)
        assert "JOINER SENT" in out and joiner.returncode != 0, (out, err)
    out, err = _finish(server)
    assert server.returncode == 0, (out, err)
    # the dead joiner's receive never errs: it stays pending, so only silence detects the loss
    lines = [line for line in out.splitlines() if line.startswith(("ADMITTED", "SILENT", "SERVER"))]
    assert sorted(lines) == ["ADMITTED 1", "ADMITTED 2", "SERVER ALIVE", f"SILENT 1 after {sent} messages",
                             f"SILENT 2 after {sent} messages"], out


def _ring_job(args: list, marker: str) -> subprocess.Popen:
    return _launch(["-n", 1, sys.executable, MPI_DIR / "ring_survivors.py", *args],
                   env={"PSGD_X_TEST_MARK": marker, "PYTHONFAULTHANDLER": "1",
                        "UCX_TLS": "posix,sysv,self"})   # shared memory only: see the probe


@mpich_only
@pytest.mark.parametrize("members, when", [(3, "after"), (3, "before"), (4, "after")])
def test_a_ring_over_joined_jobs_goes_on_without_a_killed_member(tmp_path, members, when):
    """One job per ring member, merged into one communicator: the survivors of a SIGKILL go on
    point to point, and agree on each clock's sum (all members' before, the survivors' after)."""
    port, marker, clocks, dead = tmp_path / "port", uuid.uuid4().hex, 40, 2
    coord = _ring_job(["coord", port, members, clocks], marker)
    deadline = time.monotonic() + 30
    while not port.exists() and time.monotonic() < deadline and coord.poll() is None:
        time.sleep(0.05)
    assert port.exists(), _finish(coord)
    ring = [_ring_job(["ring", port, dead, when, clocks, 512], marker) for _ in range(members)]
    outs = [_finish(p, 90) for p in ring]
    out, err = _finish(coord, 30)
    assert coord.returncode == 0 and "COORD DONE" in out, (out, err)
    assert not wait_marked_gone(marker, 10), "a process of the probe was left behind"
    # exactly one member (the one of rank `dead`) was killed; every other one finished
    said = "\n---\n".join(o + e for o, e in outs)
    assert sorted(p.returncode == 0 for p in ring) == [False] + [True] * (members - 1), said
    results = {}
    for (o, e), p in zip(outs, ring):
        if p.returncode == 0:
            sums = json.loads(o.split("SUMS ", 1)[1].splitlines()[0])
            rings = json.loads(o.split("RING ", 1)[1].splitlines()[0])
            results[o.split("RANK ", 1)[1].split()[0]] = (sums, rings)
    assert len(results) == members - 1, said
    (sums, rings), = {json.dumps(r): r for r in results.values()}.values()   # all agree
    everyone, survivors = list(range(1, members + 1)), [r for r in range(1, members + 1) if r != dead]
    assert rings[0] == everyone and rings[-1] == survivors, rings
    # one switch, near the killed one's clock: a clock that it finished before it died, or that
    # a survivor finished with its messages sent before the kill, keeps everyone's sum
    switch = rings.index(survivors)
    assert rings[:switch] == [everyone] * switch and rings[switch:] == [survivors] * (clocks - switch)
    assert clocks // 2 - 1 <= switch <= clocks // 2 + 1, rings
    assert sums == [sum(r + 1000.0 * c for r in rings[c]) for c in range(clocks)]
