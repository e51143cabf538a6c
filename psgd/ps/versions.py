"""A server's shard as a few parameter versions: replies read the live one while a step writes a spare.

The step is in place when no pull reply is reading the live buffer, and out
of place into a spare buffer otherwise, so a reply in flight never sees a
half-updated shard.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.kernels.finite import finite
from psgd.mpi import wait as _wait
from psgd.nn.optim import Optimizer

SPARES = 2


def step_into(optimizer: Optimizer, src: np.ndarray, grad: np.ndarray, dst: np.ndarray,
              lr: float, scale: float = 1.0, check_first: bool = False,
              grad2: np.ndarray | None = None) -> bool:
    """One optimizer step from ``src`` into ``dst`` (float32, the optimizer's length).

    Parameters
    ----------
    optimizer : Optimizer
        Steps with :meth:`Optimizer.step_into`: its per-element state is
        updated in place, its step count is not advanced.
    src, grad, dst : ndarray, float32 (n,)
        ``src`` is only read (unless it is ``dst``).
    lr : float
    scale : float
        Multiplies ``grad`` before the step (1 / count for a mean of a sum).
    check_first : bool
        Check ``grad`` in a separate pass before touching any state, so a
        non-finite gradient changes nothing (the server's ``skip_nonfinite``).
        Without it the check shares the step's pass, and after a non-finite
        gradient ``dst`` and a stateful optimizer's state are garbage.
    grad2 : ndarray, float32 (n,), optional
        Step on ``grad + grad2`` (summed in the step's pass).  ``check_first``
        checks ``grad`` alone, so :meth:`ShardVersions.step`, its one caller
        that checks first, refuses the two together.

    Returns
    -------
    bool
        True when every ``grad`` value was finite (and the step was applied).
    """
    if check_first and not finite(grad):
        return False
    return bool(optimizer.step_into(src, grad, dst, lr, scale, grad2))


class ShardVersions:
    """The live parameters of one shard and ``spares`` buffers for the next versions.

    Parameters
    ----------
    init : ndarray, float32 (n,)
        The initial parameters; becomes the first live buffer (not copied).
    spares : int
        Spare buffers (>= 1); memory is (1 + spares) shard lengths.

    Attributes
    ----------
    n_waits : int
        Steps that had to wait for a reply to finish reading a spare.
    n_in_place : int
        Steps applied in place (no reply was reading the live buffer).
    """

    def __init__(self, init: np.ndarray, spares: int = SPARES) -> None:
        if spares < 1:
            raise ValueError(f"a shard needs at least one spare version buffer, got {spares}")
        self.buffers = [init] + [np.empty_like(init) for _ in range(spares)]
        self.reqs: list[list] = [[] for _ in self.buffers]
        self.retired = list(range(1, len(self.buffers)))   # not live, oldest first
        self.index = 0
        self.n_waits = 0
        self.n_in_place = 0

    @property
    def live(self) -> np.ndarray:
        """The current parameters (float32 (n,)); never written while it is live."""
        return self.buffers[self.index]

    def reply_sent(self, request: MPI.Request) -> None:
        """Record a send that reads the live buffer; the buffer is not reused until it completes."""
        self.reqs[self.index].append(request)

    def reap(self) -> None:
        """Drop completed reply requests."""
        for i, reqs in enumerate(self.reqs):
            if reqs and MPI.Request.Testall(reqs):
                self.reqs[i] = []

    def step(self, optimizer: Optimizer, grad: np.ndarray, lr: float, scale: float = 1.0,
             skip_nonfinite: bool = False, grad2: np.ndarray | None = None) -> bool:
        """Apply one step to the live parameters, in place if no reply reads them, else into a spare.

        Returns False when the gradient was not finite.  With ``skip_nonfinite``
        the shard and the optimizer state are then as before (the gradient is
        checked in a pass of its own where the step could not undo itself);
        without it they are undefined, and the caller ends the job.

        ``grad2``: step on ``grad + grad2`` (float32 sum) in the step's own
        pass; neither is written.  Not with ``skip_nonfinite``, whose check
        must see the sum before the step: the caller adds the two itself.
        """
        if grad2 is not None and skip_nonfinite:
            raise ValueError("a step on grad + grad2 cannot check their sum first; with "
                             "skip_nonfinite add them before the step")
        self.reap()
        if not self.reqs[self.index]:
            if skip_nonfinite and not finite(grad):
                return False
            if not optimizer.step(self.live, grad, lr, scale, check=True, grad2=grad2):
                return False
            self.n_in_place += 1
            return True
        spare = next((i for i in self.retired if not self.reqs[i]), None)
        if spare is None:
            spare = self.retired[0]
            self.n_waits += 1
            _wait.waitall(self.reqs[spare], "workers to receive a pull reply of an older "
                          "version (its buffer is needed for the next one)")
            self.reqs[spare] = []
        # out of place, a non-finite SGD gradient leaves the live buffer as it was
        check_first = skip_nonfinite and bool(optimizer.state_keys)
        if not step_into(optimizer, self.live, grad, self.buffers[spare], lr, scale, check_first,
                         grad2):
            return False
        optimizer.steps += 1
        self.retired.remove(spare)
        self.retired.append(self.index)
        self.index = spare
        return True

    def all_requests(self) -> list:
        """Every reply request not yet seen complete."""
        return [r for reqs in self.reqs for r in reqs]
