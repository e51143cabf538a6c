"""How workers get in: a knock file beside the port file, then MPI_Comm_accept on the server.

With MPICH 5.0.2, a thread waiting in ``MPI_Comm_accept`` blocks every other thread's sends
(docs/design/elastic.md), so the servers cannot wait for joiners on a thread while they
train; and two joiners connecting at once crash the accepting process (SIGBUS). So a joiner
writes ``PORT_FILE.knock.<id>`` and waits for ``PORT_FILE.turn.<id>``; the servers look for
knocks between messages and give one joiner at a time its turn. The joiner answers by renaming
its turn to ``PORT_FILE.ready.<id>`` and connects at once; only then do the servers accept. A
joiner that died after knocking never answers: its turn lapses and the servers go on.
A knock names the joiner's process (host and pid), so that the servers see it die while it is
being admitted: a turn whose joiner died lapses at once, and with ``stand_in`` an accept whose
joiner died is released by a connection of a throwaway job of the servers' (MPI cannot cancel
an accept). A knock may also say what the joiner is for (model, data, protocol: :func:`psgd.elastic.hello.claims`);
one that differs from the run gets ``PORT_FILE.refused.<id>`` with one line instead of a turn,
so it never reaches MPI and takes no slot.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid

from mpi4py import MPI

from psgd.elastic import leave, segments_of, unlink_unmapped
from psgd.elastic.alive import ALIVE, PLACE, running
from psgd.elastic.hello import differs
from psgd.errors import UsageError
from psgd.mpi.phase import phase

KNOCK, TURN, READY, REFUSED = ".knock.", ".turn.", ".ready.", ".refused."
SAYING = ".saying."   # a knock or a refusal being written (renamed into place when whole)
LOOK_EVERY_S = 0.25   # how often the servers look for knocks
STAND_IN_S = 30.0     # how long a stand-in's connection may take to release an accept


def knock(port_file: str, wait_s: float, kind: str = "", said: dict | None = None) -> None:
    """Announce a joiner, wait for its turn, and take it (the caller connects next); ``kind``
    starts its knock's name (psgd.elastic.replica: a backup, a re-routing worker); ``said``:
    what it is for (:func:`psgd.elastic.hello.claims`), checked by the servers.

    Raises
    ------
    UsageError
        The servers gave no turn within ``wait_s`` seconds, took it back, or refused this
        joiner (its ``said`` differs from the run).
    """
    name = f"{kind}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    _write(port_file, KNOCK + name, json.dumps({**(said or {}), "who": [PLACE, os.getpid()]}))
    deadline = time.monotonic() + wait_s
    with phase("waiting for a turn to join"):
        while not os.path.exists(port_file + TURN + name):
            if os.path.exists(port_file + REFUSED + name):
                with open(port_file + REFUSED + name, encoding="utf-8") as fh:
                    why = fh.read().strip()
                _remove(port_file + REFUSED + name)
                raise UsageError(f"the run at {port_file} refused this worker: {why}")
            if time.monotonic() > deadline:
                _remove(port_file + KNOCK + name)
                _remove(port_file + TURN + name)
                raise UsageError(f"the servers at {port_file} did not admit this worker within "
                                 f"{wait_s:g} s (--wait)")
            time.sleep(0.02)
    try:
        os.replace(port_file + TURN + name, port_file + READY + name)
    except FileNotFoundError:
        raise UsageError(f"the servers at {port_file} took this worker's turn back before it "
                         f"answered (it was slower than their --stall-timeout)") from None


class Door:
    """The servers' side: ``port`` published in ``port_file``, knocks answered by :meth:`admit`.

    ``accept_s``: how long a joiner has to answer its turn; and an accept that a joiner never
    completes (it died between its answer and its connect) cannot be interrupted in MPI, so
    after this long the server job prints why and ends (exit 1; its last checkpoint stands).

    ``run``: the run's ``model``, ``protocol`` and ``data`` (a path), against which a knock's
    claims are checked (None: none are); ``refused`` collects the lines of those refused, for
    the caller to log.

    ``stand_in``: when the joiner of an accept is seen dead (its process on this host ended),
    release the accept by connecting a throwaway one-rank job to the port, and set ``void``
    (the caller then drops what it accepted); otherwise, and for a joiner on another host, the
    server job ends after ``accept_s`` as above. ``joiners``: each admitted joiner's
    :class:`Joiner`, by knock name, for the caller to take.
    """

    def __init__(self, comm: MPI.Comm, port: str, port_file: str, accept_s: float,
                 run: dict | None = None) -> None:
        self.comm, self.port, self.port_file = comm, port, port_file
        self.accept_s, self.run, self.digests = float(accept_s), run, {}
        self.refused: list[str] = []
        self.joiners: dict[str, Joiner] = {}
        self.stand_in, self.void = False, False
        self.next_look = 0.0
        self.turn: tuple[str, float] | None = None   # the joiner whose turn it is, and since when
        self.pattern = "*"   # the knock names that get a turn (a replicated run: its backup first)

    def look(self) -> tuple[str | None, str | None]:
        """``(ready, lapsed)``: the joiner that answered its turn (admit it now), and one that
        did not within ``accept_s`` (its turn is withdrawn); a new turn is given when none is
        out (knocks looked for at most every LOOK_EVERY_S)."""
        now = time.monotonic()
        if self.turn is not None:
            name, since = self.turn
            joiner = self.joiners.get(name)
            if os.path.exists(self.port_file + READY + name):
                self.turn, self.next_look = None, 0.0
                return name, None
            if now - since > self.accept_s or (joiner is not None and joiner.dead()):
                self.turn = None
                _remove(self.port_file + TURN + name)
                if joiner is not None:
                    joiner.tidy()
                self.joiners.pop(name, None)
                return None, name
            return None, None
        if now >= self.next_look:
            self.next_look = now + LOOK_EVERY_S
            for path in sorted(glob.glob(glob.escape(self.port_file) + KNOCK + self.pattern)):
                name = path[len(self.port_file + KNOCK):]
                said = self._said(path)
                why = said if isinstance(said, str) else (
                    differs(self.run, said, self.digests) if self.run is not None else "")
                if why:
                    _write(self.port_file, REFUSED + name, why)
                    _remove(path)
                    self.refused.append(f"the joiner {name}: {why}")
                    continue
                self.joiners[name] = Joiner.of(said)
                os.replace(path, self.port_file + TURN + name)
                self.turn = (name, now)
                break
        return None, None

    @staticmethod
    def _said(knock_path: str) -> dict | str:
        """What the knock at ``knock_path`` says, or why it cannot be read."""
        try:
            with open(knock_path, encoding="utf-8") as fh:
                text = fh.read()
            said = json.loads(text) if text.strip() else {}
        except (OSError, ValueError) as exc:
            return f"its knock could not be read ({exc})"
        if not isinstance(said, dict):
            return "its knock could not be read (not a JSON object)"
        return said

    def admit(self, ready: str | None) -> MPI.Intercomm:
        """Accept the connection of the joiner ``ready`` (as :meth:`look` named it; collective
        over the server job's ``comm``: rank 0 names it, the other servers pass None)."""
        done = threading.Event()
        who = (f"the joiner {ready} that answered its turn" if ready else
               "the joiner server rank 0 admitted")
        joiner = self.joiners.get(ready) if ready is not None else None
        self.void = False
        threading.Thread(target=self._guard, args=(done, who, joiner), daemon=True).start()
        try:
            return self.comm.Accept(self.port, root=0)
        finally:
            done.set()
            if ready is not None:
                _remove(self.port_file + READY + ready)

    def _guard(self, done: threading.Event, who: str, joiner: Joiner | None) -> None:
        """End the server job when the accept waits past ``accept_s``, unless its joiner died
        and a stand-in releases it (``stand_in``; other server ranks wait for rank 0's)."""
        limit = self.accept_s + (STAND_IN_S if self.stand_in and joiner is None else 0.0)
        deadline = time.monotonic() + limit
        while not done.wait(0.02):
            if self.stand_in and joiner is not None and joiner.dead():
                self.void = True
                joiner.tidy()
                proc = _stand_in(self.port)
                if done.wait(STAND_IN_S):
                    threading.Thread(target=_reap, args=(proc,), daemon=True).start()
                    return
                proc.kill()
                print(f"psgd: error: {who} died before it connected, and a stand-in's "
                      f"connection did not release the accept within {STAND_IN_S:g} s; the "
                      f"servers end here (their last checkpoint stands)",
                      file=sys.stderr, flush=True)
                leave(1)
            if time.monotonic() > deadline:
                print(f"psgd: error: {who} did not connect within {limit:g} s, and MPI "
                      f"cannot stop waiting for it; the servers end here (their last "
                      f"checkpoint stands)", file=sys.stderr, flush=True)
                leave(1)

    def close(self) -> None:
        """Remove the port file and any knock, turn, answer or beat left (a joiner then finds no
        run)."""
        base = glob.escape(self.port_file)
        for path in [self.port_file, *(p for mark in (KNOCK, TURN, READY, REFUSED, SAYING, ALIVE)
                                       for p in glob.glob(base + mark + "*"))]:
            _remove(path)


class Joiner:
    """A knocking joiner's process as its knock named it: ``place`` and ``pid``, and the MPICH
    segments it maps (read when it got its turn; a SIGKILLed job leaves them in /dev/shm)."""

    def __init__(self, place: str | None, pid: int | None) -> None:
        self.place, self.pid = place, pid
        self.here = place == PLACE and pid is not None
        self.segments = segments_of(pid) if self.here else []

    @classmethod
    def of(cls, said: dict) -> Joiner:
        who = said.get("who")
        try:
            return cls(str(who[0]), int(who[1]))
        except (TypeError, ValueError, IndexError):
            return cls(None, None)

    def dead(self) -> bool:
        """Certainly gone: it ran on this host and its pid has ended."""
        return self.here and not running(self.pid)

    def tidy(self) -> None:
        """Unlink its segments that nobody maps, once it is dead."""
        if self.dead():
            unlink_unmapped(self.segments)


def _stand_in(port: str) -> subprocess.Popen:
    """A one-rank job of this host that connects to ``port`` and leaves at once (its MPICH
    segment unlinked), started without this job's launcher variables."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    mpiexec = here if os.path.exists(here) else (shutil.which("mpiexec") or "mpiexec")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "HYDI_", "MPI_LOCAL"))}
    code = ("import sys\nfrom mpi4py import MPI\nfrom psgd.elastic import leave\n"
            "MPI.COMM_SELF.Connect(sys.argv[1])\nleave(0)\n")
    return subprocess.Popen([mpiexec, "-n", "1", sys.executable, "-c", code, port], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _reap(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=STAND_IN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _write(port_file: str, mark: str, text: str) -> None:
    """``port_file + mark`` holding ``text``, put in place whole (the other side polls for it)."""
    tmp = port_file + SAYING + mark.strip(".") + f".{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, port_file + mark)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
