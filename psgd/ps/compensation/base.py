"""The staleness-compensation interface, and the method that changes nothing."""
from __future__ import annotations

import math

import numpy as np


class Summary:
    """Count, mean, min and max of one number per update (a factor, a gap)."""

    def __init__(self) -> None:
        self.count, self.total, self.low, self.high = 0, 0.0, math.inf, -math.inf

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.low = min(self.low, value)
        self.high = max(self.high, value)

    def as_dict(self) -> dict:
        if not self.count:
            return {"updates": 0}
        return {"updates": self.count, "mean": self.total / self.count, "min": self.low,
                "max": self.high}


class Compensation:
    """Step each push as it comes: the interface every method implements.

    Parameters
    ----------
    config : ProtocolConfig
    optimizer : psgd.nn.optim.Optimizer
        The server's optimizer for this shard (a method may adjust its hyper-parameters).
    n : int
        The shard's length.
    n_workers : int
        W (a method may keep something per worker).

    Attributes
    ----------
    reads_params : bool
        The method needs ``read``, the parameters each push was computed on
        (the server then keeps a copy of every worker's last pull reply).
    factor : Summary
        What the method did, one value per update (its ``describes`` says what).
    """

    name = "none"
    reads_params = False
    describes = "learning-rate factor"

    def __init__(self, config, optimizer, n: int, n_workers: int = 1) -> None:
        self.config, self.optimizer, self.n, self.n_workers = config, optimizer, n, n_workers
        self.counted = n_workers   # --elastic: the workers that joined and were not lost
        self.factor = Summary()

    def buffers(self) -> list:
        """The shard-length float32 arrays the method holds."""
        return []

    def adjust(self, grad: np.ndarray, lr: float, staleness: int, delay: int,
               now: np.ndarray, read: np.ndarray | None,
               worker: int = 0) -> tuple[np.ndarray, float]:
        """The gradient and learning rate to step with instead of ``grad`` and ``lr``.

        Parameters
        ----------
        grad : ndarray, float32 (n,)
            The push; never written (it may be a worker's push-window segment).
        lr : float
            The scheduled learning rate of the push's clock.
        staleness : int
            Clocks: the push's clock minus the version it read.
        delay : int
            Updates this shard took between the worker's read and this push.
        now : ndarray, float32 (n,)
            The shard's live parameters.
        read : ndarray, float32 (n,) or None
            The parameters the push was computed on (only with ``reads_params``).
        worker : int
            Which worker (0..W-1) pushed.
        """
        return grad, lr

    def count_delay(self, delay: int, worker: int) -> None:
        """Count a push's delay into the running means :meth:`adjust` keeps, without the push
        (a resumed replay's pushes before its step); nothing here."""

    def reply(self, worker: int, clock: int, live: np.ndarray, lr: float) -> np.ndarray:
        """The parameters that answer ``worker``'s pull for ``clock``: ``live`` itself here.

        A method may answer with an array of its own instead; the server then
        hands it the send's request (:meth:`reply_sent`) and does not touch
        that array until the request completes.
        """
        return live

    def worker_done(self, worker: int) -> None:
        """``worker`` has sent its last push."""

    def vacate(self) -> None:
        """``--elastic``: no worker is counted until it joins (:meth:`joined`)."""
        self.counted = 0

    def joined(self, worker: int) -> None:
        """``--elastic``: a worker took slot ``worker``; it counts from now on."""
        self.counted += 1

    def lost(self, worker: int) -> None:
        """``--elastic``: the worker of slot ``worker`` was lost, not done: it will push no
        more, and a reply sent to it may never be received (here: :meth:`worker_done`)."""
        self.counted -= 1
        self.worker_done(worker)

    def carried(self) -> list:
        """The slots whose per-worker state a resumed checkpoint carried (none here)."""
        return []

    def state(self) -> dict:
        """The method's per-element state (float32 arrays of the shard's length) by name, for
        checkpoints beside the optimizer's; its running means of delays are not kept."""
        return {}

    def load_state(self, state: dict) -> None:
        """Take back what :meth:`state` gave, from a resumed checkpoint's ``state`` (cut to
        this shard); a name it lacks leaves that array at its start."""
        for key, mine in self.state().items():
            if key not in state:
                continue
            value = np.asarray(state[key], np.float32)
            if value.shape != mine.shape:
                raise ValueError(f"--staleness-comp {self.name}: checkpoint state {key!r} has "
                                 f"shape {value.shape}, expected {mine.shape}")
            mine[:] = value

    def reply_sent(self, worker: int, clock: int, request) -> None:
        """The send of an array :meth:`reply` returned (not ``live``) started as ``request``."""

    def requests(self) -> list:
        """Sends of this method's arrays not yet seen complete."""
        return []

    def worker_momentum(self) -> float:
        """The momentum a worker's velocity takes now, under ``--momentum-correction``
        (``config.worker_momentum``; 0 without it): the user's, unless the method sets it."""
        return float((self.config.worker_momentum or {}).get("momentum", 0.0))

    def summary(self) -> dict:
        """What the method did over the run, for the metrics log."""
        return {"method": self.name, self.describes: self.factor.as_dict()}
