"""The beat files of an elastic run (psgd.elastic.alive): a death on this host is seen from the
pid, a stopped beat on another host from the file's time, and a clean end removes the file."""
import os
import signal
import subprocess
import sys
import time

import pytest

from psgd.elastic.alive import BEAT_S, FRESH_S, PLACE, Beat, Pulse, beat_path, running


def test_a_beat_names_this_process_moves_and_is_removed_at_its_end(tmp_path):
    path = beat_path(str(tmp_path / "port"), 3)
    assert path.endswith("port.alive.3")
    beat = Beat(path)
    try:
        assert open(path).read().split() == [PLACE, str(os.getpid())]
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
    path.write_text(f"{PLACE} {child.pid}\n")
    now = [0.0]
    pulse = Pulse(str(path), clock=lambda: now[0])
    assert not pulse.dead() and pulse.gone(1.0) == ""
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while running(child.pid) and time.monotonic() < deadline:   # a zombie until reaped
        time.sleep(0.01)
    assert not pulse.dead()   # seen running FRESH_S ago: not looked at again yet
    now[0] += FRESH_S
    assert pulse.dead() and str(child.pid) in pulse.gone(1.0)
    child.wait()
    assert pulse.dead()


def test_a_process_that_ends_while_its_stat_is_read_has_ended(monkeypatch):
    """Linux answers ESRCH to a read of /proc/<pid>/stat when the pid ended after the open."""
    def ended(*args, **kwargs):
        raise ProcessLookupError(3, "No such process")
    assert running(os.getpid())
    monkeypatch.setattr("builtins.open", ended)
    assert not running(os.getpid())


def test_another_hosts_beat_is_quiet_when_its_file_stops_moving(tmp_path):
    now = [100.0]
    path = tmp_path / "port.alive"
    path.write_text(f"{PLACE}-elsewhere 1\n")   # pid 1 there says nothing here
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


def test_stale_mpich_segments_go_and_mapped_or_young_ones_stay():
    from psgd.elastic import SEGMENT_PREFIX, remove_stale_segments
    if not os.path.isdir("/proc/self") or not os.path.isdir(os.path.dirname(SEGMENT_PREFIX)):
        pytest.skip("needs /proc and /dev/shm")
    tag = f"psgdtest{os.getpid()}"
    stale, mapped, young = (f"{SEGMENT_PREFIX}{tag}{k}_0" for k in ("s", "m", "y"))
    holder = None
    try:
        for path in (stale, mapped):
            with open(path, "wb") as fh:
                fh.write(b"\0" * 4096)
        holder = subprocess.Popen([sys.executable, "-c", (
            "import mmap, sys, time\nf = open(sys.argv[1], 'r+b')\n"
            "m = mmap.mmap(f.fileno(), 0)\nprint('mapped', flush=True)\ntime.sleep(60)"),
            mapped], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "mapped"
        time.sleep(1.2)
        with open(young, "wb") as fh:
            fh.write(b"\0" * 4096)
        removed = remove_stale_segments(min_age_s=1.0)
        assert stale in removed and not os.path.exists(stale)
        assert os.path.exists(mapped) and os.path.exists(young), removed
        assert mapped not in removed and young not in removed
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        for path in (stale, mapped, young):
            if os.path.exists(path):
                os.unlink(path)
