"""The worker half of an elastic run: a parameter-server worker that stops when a reply says
the run is over."""
from __future__ import annotations

from psgd.ps.messages import DROPPED, OVER
from psgd.ps.worker import PSWorker


class ElasticWorker(PSWorker):
    """:class:`psgd.ps.worker.PSWorker` over the servers' intercommunicator (``roles.comm``,
    server s is remote rank s), without the push window (no memory is shared across jobs).

    Attributes
    ----------
    over : bool
        A server answered a pull with ``OVER``: the run is over; call :meth:`finish`.
    dropped : bool
        A server answered with ``DROPPED``: the servers dropped this worker (it was silent
        too long); it leaves without :meth:`finish`.
    """

    over = dropped = False

    def _wait_pull(self) -> None:
        super()._wait_pull()
        self.over = self.over or bool((self._reply_hdr[:, 3] == OVER).any())
        self.dropped = self.dropped or bool((self._reply_hdr[:, 3] == DROPPED).any())
