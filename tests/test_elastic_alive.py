"""The beat files of an elastic run (psgd.elastic.alive): a death on this host is seen from the
pid, a stopped beat on another host from the file's time, and a clean end removes the file."""
import os
import signal
import subprocess
import sys
import time

from psgd.elastic.alive import BEAT_S, HOST, Beat, Pulse, beat_path, running


def test_a_beat_names_this_process_moves_and_is_removed_at_its_end(tmp_path):
    path = beat_path(str(tmp_path / "port"), 3)
    assert path.endswith("port.alive.3")
    beat = Beat(path)
    try:
        assert open(path).read().split() == [HOST, str(os.getpid())]
        first = os.stat(path).st_mtime_ns
        deadline = time.monotonic() + 20 * BEAT_S
        while os.stat(path).st_mtime_ns == first and time.monotonic() < deadline:
            time.sleep(BEAT_S / 4)
        assert os.stat(path).st_mtime_ns != first, "the beat did not move"
    finally:
        beat.stop()
    assert not os.path.exists(path)


def test_a_process_of_this_host_is_dead_once_it_ends_zombie_or_reaped(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    path = tmp_path / "port.alive.0"
    path.write_text(f"{HOST} {child.pid}\n")
    pulse = Pulse(str(path))
    assert not pulse.dead() and pulse.gone(1.0) == ""
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while running(child.pid) and time.monotonic() < deadline:   # a zombie until reaped
        time.sleep(0.01)
    assert pulse.dead() and str(child.pid) in pulse.gone(1.0)
    child.wait()
    assert pulse.dead()


def test_another_hosts_beat_is_quiet_when_its_file_stops_moving(tmp_path):
    now = [100.0]
    path = tmp_path / "port.alive"
    path.write_text(f"{HOST}-elsewhere 1\n")   # pid 1 there says nothing here
    pulse = Pulse(str(path), clock=lambda: now[0])
    assert not pulse.dead() and pulse.quiet_s() == 0.0
    now[0] += 7.0
    assert pulse.quiet_s() == 7.0
    assert "has not moved for 7 s" in pulse.gone(5.0) and pulse.gone(8.0) == ""
    os.utime(path, ns=(1, os.stat(path).st_mtime_ns + 10**9))   # the far process beat
    assert pulse.quiet_s() == 0.0
    now[0] += 2.0
    assert pulse.quiet_s() == 2.0


def test_no_beat_file_tells_nothing(tmp_path):
    pulse = Pulse(str(tmp_path / "missing"))
    assert not pulse.dead() and pulse.quiet_s() == 0.0 and pulse.gone(0.0) == ""
