"""How workers get in: a knock file beside the port file, then MPI_Comm_accept on the server.

With MPICH 5.0.2, a thread waiting in ``MPI_Comm_accept`` blocks every other thread's sends
(docs/design/elastic.md), so the servers cannot wait for joiners on a thread while they
train; and two joiners connecting at once crash the accepting process (SIGBUS). So a joiner
writes ``PORT_FILE.knock.<id>`` and waits for ``PORT_FILE.turn.<id>``; the servers look for
knocks between messages and, one joiner at a time, write its turn file and accept it.
"""
from __future__ import annotations

import glob
import os
import sys
import threading
import time
import uuid

from mpi4py import MPI

KNOCK, TURN = ".knock.", ".turn."
LOOK_EVERY_S = 0.25   # how often the servers look for knocks


def knock(port_file: str, wait_s: float) -> None:
    """Announce a joiner and wait for its turn to call ``MPI_Comm_connect``.

    Raises
    ------
    ValueError
        The servers gave no turn within ``wait_s`` seconds.
    """
    name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with open(port_file + KNOCK + name, "w", encoding="utf-8"):
        pass
    deadline = time.monotonic() + wait_s
    while not os.path.exists(port_file + TURN + name):
        if time.monotonic() > deadline:
            os.unlink(port_file + KNOCK + name)
            raise ValueError(f"the servers at {port_file} did not admit this worker within "
                             f"{wait_s:g} s (--wait)")
        time.sleep(0.02)


class Door:
    """The servers' side: ``port`` published in ``port_file``, knocks answered by :meth:`admit`.

    ``accept_s``: an accept that a knocking joiner never completes (it died between its knock
    and its connect) cannot be interrupted in MPI; after this long the server job prints why
    and ends (exit 1; its last checkpoint stands).
    """

    def __init__(self, comm: MPI.Comm, port: str, port_file: str, accept_s: float) -> None:
        self.comm, self.port, self.port_file = comm, port, port_file
        self.accept_s = float(accept_s)
        self.next_look = 0.0

    def knocks(self) -> list[str]:
        """Knock files waiting (looked for at most every LOOK_EVERY_S)."""
        now = time.monotonic()
        if now < self.next_look:
            return []
        self.next_look = now + LOOK_EVERY_S
        return sorted(glob.glob(glob.escape(self.port_file) + KNOCK + "*"))

    def admit(self, knock_file: str | None) -> MPI.Intercomm:
        """Accept the connection of the joiner that wrote ``knock_file`` (collective over the
        server job's ``comm``: rank 0 names the knock, the other servers pass None)."""
        turn = None
        if knock_file is not None:
            turn = self.port_file + TURN + knock_file[len(self.port_file + KNOCK):]
            os.replace(knock_file, turn)
        done = threading.Event()
        who = (f"the joiner that knocked ({os.path.basename(knock_file)})" if knock_file else
               "the joiner server rank 0 admitted")
        threading.Thread(target=self._guard, args=(done, who), daemon=True).start()
        try:
            return self.comm.Accept(self.port, root=0)
        finally:
            done.set()
            if turn is not None:
                os.unlink(turn)

    def _guard(self, done: threading.Event, who: str) -> None:
        if not done.wait(self.accept_s):
            print(f"psgd: error: {who} did not connect within {self.accept_s:g} s, and MPI "
                  f"cannot stop waiting for it; the servers end here (their last checkpoint "
                  f"stands)", file=sys.stderr, flush=True)
            os._exit(1)

    def close(self) -> None:
        """Remove the port file and any knock left (a joiner then finds no run)."""
        for path in [self.port_file] + glob.glob(glob.escape(self.port_file) + KNOCK + "*"):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
