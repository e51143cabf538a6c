"""The worker half of an elastic run: a parameter-server worker that stops when a reply says
the run is over, and that leaves when its servers are gone."""
from __future__ import annotations

import time

from psgd.elastic.alive import Pulse, beat_path
from psgd.errors import PsgdError
from psgd.mpi.phase import phase
from psgd.ps.messages import DROPPED, OVER
from psgd.ps.worker import PSWorker

LOOK_EVERY_S = 1.0   # how often a waiting worker checks that its servers are still there
QUIET_TIMEOUTS = 5   # a server beat still for this many --stall-timeout: the servers are gone


class ServersGone(PsgdError):
    """The servers' job has ended: the port file this worker joined by was removed or replaced,
    or their process is gone (killed)."""


class ElasticWorker(PSWorker):
    """:class:`psgd.ps.worker.PSWorker` over the servers' intercommunicator (``roles.comm``,
    server s is remote rank s), without the push window (no memory is shared across jobs).

    Parameters
    ----------
    port_file, port : str
        Where the servers published ``port``; while a push or pull waits, the worker checks
        every LOOK_EVERY_S that the file still names it and that the servers' beat lives
        (:mod:`psgd.elastic.alive`: their process on this host runs, or their beat on another
        host moved within QUIET_TIMEOUTS x ``stall_timeout``), and raises
        :class:`ServersGone` if not (the servers remove the file when their run ends; a killed
        server job leaves it, but not its process).
    stall_timeout : float
        The run's --stall-timeout.
    fault : psgd.mpi.faults.Fault, optional
        Tests (``PSGD_X_FAULT``): fired at its clock after the push is posted, before it
        completes (mid-push).

    Attributes
    ----------
    over : bool
        A server answered a pull with ``OVER``: the run is over; call :meth:`finish`.
    dropped : bool
        A server answered with ``DROPPED``: the servers dropped this worker (it was silent
        too long); it leaves without :meth:`finish`.
    """

    over = dropped = pulled = False

    def __init__(self, roles, shard_map, config, *, port_file: str, port: str,
                 stall_timeout: float, fault=None) -> None:
        super().__init__(roles, shard_map, config)
        self.port_file, self.port, self.fault = port_file, port, fault
        self.servers = Pulse(beat_path(port_file))
        self.quiet_limit = QUIET_TIMEOUTS * stall_timeout
        self.next_look = time.monotonic() + LOOK_EVERY_S
        self.between_polls = self._look

    def _look(self) -> None:
        now = time.monotonic()
        if now < self.next_look:
            return
        self.next_look = now + LOOK_EVERY_S
        try:
            with open(self.port_file, encoding="utf-8") as fh:
                same = fh.read().strip() == self.port
        except FileNotFoundError:
            same = False
        if not same:
            raise ServersGone(f"the servers' run has ended ({self.port_file} is gone)")
        why = self.servers.gone(self.quiet_limit)
        if why:
            raise ServersGone(f"the server job is gone ({why}; it was killed? --resume auto "
                              f"continues it from its last checkpoint)")

    def _wait_push(self, push: list, owners: list, clock: int) -> None:
        if self.fault is not None:
            self.fault.at(clock)
        super()._wait_push(push, owners, clock)

    def _wait_pull(self) -> None:
        if not self.pulled:   # its first parameters (PSGD_X_FAULT can stop it here)
            self.pulled = True
            with phase("receiving the first parameters"):
                super()._wait_pull()
        else:
            super()._wait_pull()
        self.over = self.over or bool((self._reply_hdr[:, 3] == OVER).any())
        self.dropped = self.dropped or bool((self._reply_hdr[:, 3] == DROPPED).any())
