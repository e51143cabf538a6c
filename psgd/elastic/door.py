"""How workers get in: a knock file beside the port file, then MPI_Comm_accept on the server.

With MPICH 5.0.2, a thread waiting in ``MPI_Comm_accept`` blocks every other thread's sends
(docs/design/elastic.md), so the servers cannot wait for joiners on a thread while they
train; and two joiners connecting at once crash the accepting process (SIGBUS). So a joiner
writes ``PORT_FILE.knock.<id>`` and waits for ``PORT_FILE.turn.<id>``; the servers look for
knocks between messages and give one joiner at a time its turn. The joiner answers by renaming
its turn to ``PORT_FILE.ready.<id>`` and connects at once; only then do the servers accept. A
joiner that died after knocking never answers: its turn lapses and the servers go on.
A knock may say what the joiner is for (model, data, protocol: :func:`psgd.elastic.hello.claims`);
one that differs from the run gets ``PORT_FILE.refused.<id>`` with one line instead of a turn,
so it never reaches MPI and takes no slot.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import threading
import time
import uuid

from mpi4py import MPI

from psgd.elastic import leave
from psgd.elastic.alive import ALIVE
from psgd.elastic.hello import differs
from psgd.errors import UsageError
from psgd.mpi.phase import phase

KNOCK, TURN, READY, REFUSED = ".knock.", ".turn.", ".ready.", ".refused."
SAYING = ".saying."   # a knock or a refusal being written (renamed into place when whole)
LOOK_EVERY_S = 0.25   # how often the servers look for knocks


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
    _write(port_file, KNOCK + name, json.dumps(said) if said else "")
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
    """

    def __init__(self, comm: MPI.Comm, port: str, port_file: str, accept_s: float,
                 run: dict | None = None) -> None:
        self.comm, self.port, self.port_file = comm, port, port_file
        self.accept_s, self.run, self.digests = float(accept_s), run, {}
        self.refused: list[str] = []
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
            if os.path.exists(self.port_file + READY + name):
                self.turn, self.next_look = None, 0.0
                return name, None
            if now - since > self.accept_s:
                self.turn = None
                _remove(self.port_file + TURN + name)
                return None, name
            return None, None
        if now >= self.next_look:
            self.next_look = now + LOOK_EVERY_S
            for path in sorted(glob.glob(glob.escape(self.port_file) + KNOCK + self.pattern)):
                name = path[len(self.port_file + KNOCK):]
                why = self._differs(path)
                if why:
                    _write(self.port_file, REFUSED + name, why)
                    _remove(path)
                    self.refused.append(f"the joiner {name}: {why}")
                    continue
                os.replace(path, self.port_file + TURN + name)
                self.turn = (name, now)
                break
        return None, None

    def _differs(self, knock_path: str) -> str:
        """What the knock at ``knock_path`` says that differs from the run ("" if nothing)."""
        if self.run is None:
            return ""
        try:
            with open(knock_path, encoding="utf-8") as fh:
                text = fh.read()
            said = json.loads(text) if text.strip() else {}
        except (OSError, ValueError) as exc:
            return f"its knock could not be read ({exc})"
        if not isinstance(said, dict):
            return "its knock could not be read (not a JSON object)"
        return differs(self.run, said, self.digests)

    def admit(self, ready: str | None) -> MPI.Intercomm:
        """Accept the connection of the joiner ``ready`` (as :meth:`look` named it; collective
        over the server job's ``comm``: rank 0 names it, the other servers pass None)."""
        done = threading.Event()
        who = (f"the joiner {ready} that answered its turn" if ready else
               "the joiner server rank 0 admitted")
        threading.Thread(target=self._guard, args=(done, who), daemon=True).start()
        try:
            return self.comm.Accept(self.port, root=0)
        finally:
            done.set()
            if ready is not None:
                _remove(self.port_file + READY + ready)

    def _guard(self, done: threading.Event, who: str) -> None:
        if not done.wait(self.accept_s):
            print(f"psgd: error: {who} did not connect within {self.accept_s:g} s, and MPI "
                  f"cannot stop waiting for it; the servers end here (their last checkpoint "
                  f"stands)", file=sys.stderr, flush=True)
            leave(1)

    def close(self) -> None:
        """Remove the port file and any knock, turn, answer or beat left (a joiner then finds no
        run)."""
        base = glob.escape(self.port_file)
        for path in [self.port_file, *(p for mark in (KNOCK, TURN, READY, REFUSED, SAYING, ALIVE)
                                       for p in glob.glob(base + mark + "*"))]:
            _remove(path)


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
