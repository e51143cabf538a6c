"""`psgd net`: the namespace exists while the command runs and is gone after success,
failure and SIGTERM; it refuses with one line where it cannot make one."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from psgd.errors import PsgdError
from psgd.run import net

PSGD = [sys.executable, "-m", "psgd", "net"]
can_make = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
_can_make = pytest.mark.skipif(not can_make, reason="needs root, ip and tc (iproute2)")


def needs_root(test):
    """Marked ``root`` (make test-all only) and skipped where no namespace can be made."""
    return pytest.mark.root(_can_make(test))


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_rates_parse_and_bad_rates_are_refused():
    assert net.parse_rate("1gbit") == 1e9
    assert net.parse_rate("500mbit") == 5e8
    assert net.parse_rate("none") is None
    assert net.burst_bytes(1e9) == net.MIN_BURST_BYTES
    assert net.burst_bytes(1e10) == 1_250_000
    for bad in ("1gb", "0gbit", "fast", "-1gbit"):
        with pytest.raises(PsgdError, match="is not a rate"):
            net.parse_rate(bad)


def test_refuses_with_one_line_when_not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(PsgdError, match="needs root"):
        net.check_can_make_namespaces()


def test_refuses_with_one_line_without_tc(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}     # neither ip nor tc
    proc = subprocess.run(PSGD + ["--", "true"], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    if os.geteuid() == 0:
        assert proc.stderr.strip() == ("psgd: error: psgd net needs ip and tc on PATH; install "
                                       "Debian's iproute2 (apt-get install -y iproute2)")
    else:
        assert "needs root" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@needs_root
def test_command_runs_in_a_shaped_namespace_that_is_removed_after_it_fails():
    script = ("ip netns identify $$; tc qdisc show dev lo; echo $MPIR_CVAR_NUM_CLIQUES $FI_PROVIDER"
              " $PSGD_X_NET; exit 3")
    proc = subprocess.run(PSGD + ["--nodes", "3", "--rate", "1gbit", "--", "sh", "-c", script],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3, proc.stderr
    name, qdisc, env = proc.stdout.splitlines()[:3]
    assert name.startswith("psgd-net-")
    assert "tbf" in qdisc and "rate 1Gbit" in qdisc
    assert env == "3 tcp 1000000000,3"    # PSGD_X_NET: what --grid auto prices its cuts on
    assert name not in namespaces()


@needs_root
def test_namespace_is_removed_when_the_run_is_terminated(tmp_path):
    marker = tmp_path / "ns"
    proc = subprocess.Popen(PSGD + ["--", "sh", "-c", f"ip netns identify $$ > {marker}; sleep 60"],
                            stderr=subprocess.PIPE, text=True)
    for _ in range(200):
        if marker.exists() and marker.read_text().strip():
            break
        time.sleep(0.05)
    name = marker.read_text().strip()
    assert name in namespaces()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM
    assert name not in namespaces()


@needs_root
def test_namespaces_of_killed_runs_are_removed_by_the_next_run():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"psgd-net-{dead.pid}"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        subprocess.run(PSGD + ["--", "true"], check=True, timeout=30)
        assert stale not in namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)
