"""What the decentralized workers share: the local optimizer step, the model average and the consensus distance."""
from __future__ import annotations

from typing import Callable

import numpy as np
from mpi4py import MPI

from psgd.errors import PsgdError
from psgd.kernels.finite import finite
from psgd.mpi import wait


def average(comm: MPI.Comm, params: np.ndarray, out: np.ndarray,
            serve: Callable[[], None] | None = None) -> float:
    """Write the workers' mean model into ``out``; return the consensus distance (collective).

    Parameters
    ----------
    comm : MPI.Comm
        The workers' communicator.
    params : ndarray, shape (n,), float32
        This worker's model.
    out : ndarray, shape (n,), float32
        Receives the mean of the workers' models.
    serve : callable, optional
        Called while waiting (so that a worker others wait on keeps answering); the
        average is then of ``params`` as they were at the call.

    Returns
    -------
    float
        The mean over workers of ||x_i - mean||^2.
    """
    size = comm.Get_size()
    if serve is not None:   # serving changes params while the sum reads them: send a copy
        params = params.copy()
    wait.wait(comm.Iallreduce(params, out, op=MPI.SUM), "the other workers (model average)",
              serve=serve)
    out /= np.float32(size)
    mine = np.array([np.sum((params.astype(np.float64) - out) ** 2)])
    total = np.zeros(1)
    wait.wait(comm.Iallreduce(mine, total, op=MPI.SUM), "the other workers (consensus distance)",
              serve=serve)
    return float(total[0]) / size


def local_step(worker, params: np.ndarray, grad: np.ndarray, lr: float, clock: int) -> None:
    """``worker.optimizer``'s step on its own model; a non-finite gradient is skipped (and
    counted in ``worker.stats["skipped"]``) under --skip-nonfinite, else it ends the job.

    Raises
    ------
    PsgdError
        ``grad`` holds NaN or Inf and ``worker.skip_nonfinite`` is False.
    """
    if not finite(grad):
        if not worker.skip_nonfinite:
            raise PsgdError(f"the gradient of clock {clock} on worker {worker.rank} holds NaN or "
                            f"Inf; lower the learning rate, or pass --skip-nonfinite")
        worker.stats["skipped"] += 1
        return
    worker.optimizer.step(params, grad, lr)
