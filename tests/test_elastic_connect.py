"""A joiner's connect is bounded (psgd.elastic.hello.connect_port): a port whose server never
accepts ends the connect with one line within the wait, where MPICH's own limit is 180 s."""
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, mpiexec_path, run_mpi

pytestmark = pytest.mark.mpi

HOLD = """import os, sys, time
from mpi4py import MPI
port = MPI.Open_port()
with open(sys.argv[1] + ".tmp", "w") as fh:
    fh.write(port)
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(60)
os._exit(0)
"""

CONNECT = """import sys, time
from psgd.elastic import leave
from psgd.elastic.hello import connect_port
from psgd.errors import UsageError
t0 = time.monotonic()
try:
    connect_port(open(sys.argv[1]).read(), float(sys.argv[2]), "the test's port")
    print("connected", flush=True)
    leave(0)
except UsageError as exc:
    print(f"{time.monotonic() - t0:.1f} {exc}", flush=True)
    leave(3)
"""


def test_a_connect_that_no_accept_meets_ends_in_one_line_within_the_wait(tmp_path):
    port = tmp_path / "port"
    (tmp_path / "hold.py").write_text(HOLD)
    (tmp_path / "connect.py").write_text(CONNECT)
    env = dict(os.environ, UCX_TLS="^cma")
    hold = subprocess.Popen([mpiexec_path(), "-n", "1", sys.executable, str(tmp_path / "hold.py"),
                             str(port)], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = time.monotonic()
        while not port.exists():
            assert hold.poll() is None and time.monotonic() - t0 < 60, "the port never opened"
            time.sleep(0.05)
        result = run_mpi(1, [tmp_path / "connect.py", port, 2], timeout=60, check=False,
                         env={"UCX_TLS": "^cma", "PYTHONPATH": str(ROOT)})
    finally:
        os.killpg(hold.pid, signal.SIGKILL)
        hold.wait()
    assert result.returncode == 3, result.stdout + result.stderr
    took, _, line = result.stdout.strip().partition(" ")
    assert 1.5 <= float(took) < 15, result.stdout
    assert line.startswith("the connection to the test's port did not complete within 2 s "
                           "(--wait; MPI: "), line
