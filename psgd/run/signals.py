"""The stop signals (SIGTERM, SIGUSR1, SIGINT): caught from the start of `psgd train`, remembered."""
from __future__ import annotations

import signal

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
EXIT_STOPPED = 75   # EX_TEMPFAIL: stopped by a signal after its checkpoint; run again to resume


class _Received:
    signum = 0
    notify = None   # called once on the first signal (psgd.run.stop tells the workers)


_received = _Received()


def _handler(signum, frame) -> None:
    if _received.signum:
        return
    _received.signum = signum
    if _received.notify is not None:
        _received.notify()


def install() -> None:
    """Catch the stop signals on this rank (no MPI needed: done before anything else)."""
    for sig in SIGNALS:
        signal.signal(sig, _handler)


def ignore() -> None:
    """Ignore the stop signals from now on: the run is over (Python's shutdown would
    otherwise restore their default action, and a late one would kill the rank)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def received() -> int:
    """The first stop signal this rank got (0: none)."""
    return _received.signum


def set_notify(notify) -> None:
    """Call ``notify()`` on the first signal (now, if one came already); None: stop calling."""
    _received.notify = notify
    if notify is not None and _received.signum:
        notify()


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
