"""A worker of a replicated run (``--replicas 2``) re-routes to the backup server when its
server job is gone: it waits for the backup's port in the port file, joins it again with its
slot, and goes on from the clock the backup holds for it."""
from __future__ import annotations

import sys
import time

from psgd.errors import UsageError


def reroute(port_file: str, port: str, slot: int, wait_s: float, gone: str):
    """``(intercommunicator, welcome, port)`` of the backup that took over from the servers at
    ``port``; :class:`psgd.elastic.worker.ServersGone` when none did within ``wait_s``."""
    from mpi4py import MPI

    from psgd.elastic.alive import Pulse, beat_path
    from psgd.elastic.door import knock
    from psgd.elastic.hello import read_port, receive_welcome
    from psgd.elastic.replica import REROUTE
    from psgd.elastic.worker import ServersGone

    print(f"psgd: worker {slot}: {gone}; re-routing to the backup server", file=sys.stderr,
          flush=True)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            new = read_port(port_file)[0]
        except UsageError:   # between the primary's file and the backup's
            new = None
        if new and new != port and not Pulse(beat_path(port_file)).dead():
            break
        if time.monotonic() > deadline:
            raise ServersGone(f"{gone}, and no backup server took over within {wait_s:g} s")
        time.sleep(0.05)
    try:
        knock(port_file, wait_s, kind=f"{REROUTE}{slot}-")
    except UsageError as exc:
        raise ServersGone(f"{gone}, and the backup did not take this worker: {exc}") from None
    inter = MPI.COMM_SELF.Connect(new)
    try:
        welcome = receive_welcome(inter, wait_s)
    except UsageError as exc:
        raise ServersGone(f"{gone}, and the backup refused this worker: {exc}") from None
    return inter, welcome, new


_KEPT: list = []   # workers of servers that are gone: their pending requests use their buffers


def forget(worker) -> None:
    """Cancel the receives of ``worker``'s pull from the servers that are gone, so nothing of
    theirs lands in the parameters later. The worker is kept: a request that stays pending (its
    sends; the process leaves by os._exit, never MPI_Finalize) must not outlive its buffers."""
    _KEPT.append(worker)
    for req in getattr(worker, "_pull_reqs", []):
        try:
            req.Cancel()
        except Exception:   # a send, or one that completed: nothing to cancel
            pass
