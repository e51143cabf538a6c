"""The bytes a training process holds before any training state: Python, numpy, numba and its
compiled kernels, MPI and h5py. Measured in a child process that starts as a rank does.

    python -m psgd.plan.base SPEC    # prints {"peak": bytes, "held": bytes} as JSON
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

from psgd.errors import UsageError

# a launcher's variables: the child, started from a rank, must not join that rank's job
LAUNCHER_VARIABLES = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_", "SLURM_")


def _peak_bytes() -> int:
    """This process's peak resident set (Linux reports ru_maxrss in KiB)."""
    return 1024 * resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _child(spec: str) -> dict:
    """Start MPI and h5py, build ``spec`` and run one forward and backward (numba compiles
    or loads its kernels); the peak resident bytes and the model's own buffers' bytes."""
    import h5py  # noqa: F401  (every rank reads its data through it)
    import numpy as np
    from mpi4py import MPI

    from psgd.plan.inputs import model_of_spec
    model = model_of_spec(spec)
    model.loss_and_grad(np.zeros((2, *model.input_shape), model.dtype), np.zeros(2, np.int64))
    MPI.COMM_WORLD.Barrier()
    return {"peak": _peak_bytes(), "held": int(model.params.nbytes + model.grad.nbytes)}


def measure(spec: str, timeout: float = 300.0) -> int:
    """Bytes a rank of ``spec`` holds beyond its model's parameters and gradient: the child's
    peak resident set less those two buffers (the memory model counts them itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARIABLES)}
    try:
        proc = subprocess.run([sys.executable, "-m", "psgd.plan.base", spec], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise UsageError(f"psgd plan: measuring a rank's base memory for {spec} took over "
                         f"{timeout:g} s") from None
    try:
        data = json.loads(proc.stdout.strip().splitlines()[-1])
        return max(0, int(data["peak"]) - int(data["held"]))
    except (ValueError, IndexError, KeyError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"psgd plan: cannot measure a rank's base memory for {spec} "
                         f"({tail})") from None


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1])))
