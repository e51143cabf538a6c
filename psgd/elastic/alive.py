"""Signs of life without MPI: each process of an elastic run beats a file beside the port file.

MPI reports no dead peer here, and MPICH may crash a process that sends to a peer dead for
seconds (docs/design/elastic.md), so the servers and the workers watch each other outside
MPI. A :class:`Beat` writes ``place pid`` (host, boot, pid namespace) to its file and touches it every BEAT_S; a
:class:`Pulse` reads it: on the same host a pid that is gone is a certain death, across hosts
a file untouched for long is a quiet process (stopped, or dead).
"""
from __future__ import annotations

import os
import socket
import threading
import time

ALIVE = ".alive"   # the servers' beat: PORT_FILE.alive; worker w's: PORT_FILE.alive.<w>
BEAT_S = 0.25
FRESH_S = 0.05   # a pid seen running is not looked at again for this long (a send to a peer
                 # dead that briefly stays pending and harms nothing; seconds-old deaths crash)
HOST = socket.gethostname()


def _place() -> str:
    """This host and pid namespace, as a beat names them (a pid is checked only where it
    means the same process: same boot of the same host, same namespace)."""
    marks = [HOST]
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as fh:
            marks.append(fh.read().strip()[:8])
        marks.append(os.readlink("/proc/self/ns/pid"))
    except OSError:   # no /proc: the host name alone
        pass
    return "/".join(m.replace(" ", "_") for m in marks)


PLACE = _place()


def beat_path(port_file: str, worker: int | None = None) -> str:
    """The beat file of the servers (``worker`` None) or of worker slot ``worker``."""
    return port_file + ALIVE + ("" if worker is None else f".{worker}")


class Beat:
    """This process's beat at ``path``: written now, touched every BEAT_S by a thread (no MPI)."""

    def __init__(self, path: str) -> None:
        self.path, self._stop = path, threading.Event()
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(f"{PLACE} {os.getpid()}\n")
        os.replace(tmp, path)
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(BEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass

    def stop(self) -> None:
        """Stop beating and remove the file (a clean end: nobody mistakes it for a death)."""
        self._stop.set()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def running(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie does not)."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
                return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):   # ESRCH: it ended during the read
            return False
        except (OSError, IndexError):
            return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class Pulse:
    """Another process's beat at ``path`` (``clock``: time.monotonic, replaced in tests)."""

    def __init__(self, path: str, clock=time.monotonic) -> None:
        self.path, self.clock = path, clock
        self.who: tuple[str, int] | None = None   # (place, pid), once the file was read
        self.mtime, self.changed = None, clock()
        self.seen_running = -FRESH_S   # when the pid was last seen running

    def _read(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                place, pid = fh.read().split()
            self.who = (place, int(pid))
        except (OSError, ValueError):
            pass

    def dead(self) -> bool:
        """True when the process is certainly gone: it runs on this host and its pid has ended.
        False when it lives, or when that cannot be told from here (another host, no file)."""
        if self.who is None:
            self._read()
        if self.who is None or self.who[0] != PLACE:
            return False
        now = self.clock()
        if now - self.seen_running < FRESH_S:
            return False
        if running(self.who[1]):
            self.seen_running = now
            return False
        return True

    def quiet_s(self) -> float:
        """Seconds since the beat last changed, on this host's clock (0 on the same host while
        the pid runs, and while there is no file: then nothing is known)."""
        if self.who is None:
            self._read()
        if self.who is None or self.who[0] == PLACE:
            return 0.0
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            return 0.0
        now = self.clock()
        if mtime != self.mtime:
            self.mtime, self.changed = mtime, now
        return now - self.changed

    def gone(self, quiet_limit: float) -> str:
        """Why the process is taken for gone ("" while it is not): its pid ended, or its beat
        has been still for longer than ``quiet_limit`` seconds."""
        if self.dead():
            return f"its process {self.who[1]} on {HOST} has ended"
        quiet = self.quiet_s()
        if quiet > quiet_limit:
            return f"its beat ({self.path}) has not moved for {quiet:.0f} s"
        return ""
