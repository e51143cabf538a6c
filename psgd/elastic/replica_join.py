"""A worker of a replicated run (``--replicas 2``) links to the backup server when it joins
(its standby link), and re-routes to the backup when its server job is gone: it waits for the
backup's port in the port file, takes the backup's welcome over its standby link (or, without
one, joins the backup anew with its slot), and goes on from the clock the backup holds for it."""
from __future__ import annotations

import sys
import time

from psgd.errors import UsageError


STANDBY_WAIT_S = 10.0    # the longest a joining worker waits for its standby link
STANDBY_WELCOME_S = 3.0  # then, once the backup's port is out, for its welcome over it


def link_standby(port_file: str, slot: int, wait_s: float = STANDBY_WAIT_S):
    """Worker ``slot``'s standby link to the backup server, made when it joins, while every
    process lives (psgd.elastic.replica); None when none was made within ``wait_s`` (a
    takeover then connects to the backup anew)."""
    from psgd.elastic.door import knock
    from psgd.elastic.hello import connect_port, read_port
    from psgd.elastic.replica import REROUTE, STANDBY
    path = port_file + STANDBY
    try:
        knock(path, wait_s, kind=f"{REROUTE}{slot}-")
        return connect_port(read_port(path)[0], wait_s, "the backup server")
    except UsageError as exc:
        print(f"psgd: worker {slot}: no standby link to the backup server ({exc}); a takeover "
              f"connects to it then", file=sys.stderr, flush=True)
        return None


def reroute(port_file: str, port: str, slot: int, wait_s: float, gone: str, standby=None):
    """``(intercommunicator, welcome, port)`` of the backup that took over from the servers at
    ``port``: over the ``standby`` link if the worker has one, else connected now;
    :class:`psgd.elastic.worker.ServersGone` when none did within ``wait_s``."""
    from psgd.elastic.alive import Pulse, beat_path
    from psgd.elastic.door import knock
    from psgd.elastic.hello import connect_port, read_port, receive_welcome
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
    if standby is not None:   # the backup sent the welcome before it published its port
        try:
            return standby, receive_welcome(standby, STANDBY_WELCOME_S), new
        except UsageError:
            _KEPT.append(standby)   # a welcome may still land there: never freed
            print(f"psgd: worker {slot}: no welcome over its standby link within "
                  f"{STANDBY_WELCOME_S:g} s; connecting to the backup anew", file=sys.stderr,
                  flush=True)
    try:
        knock(port_file, wait_s, kind=f"{REROUTE}{slot}-")
    except UsageError as exc:
        raise ServersGone(f"{gone}, and the backup did not take this worker: {exc}") from None
    try:
        inter = connect_port(new, wait_s, "the backup server")
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
