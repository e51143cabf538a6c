"""The bytes a training rank holds besides the memory model's training state: Python, numpy,
numba and its kernels, MPI and its peers' buffers, h5py, psgd's own modules. Measured by a
short all-reduce run of the model on two ranks over a small generated dataset.

    python -m psgd.plan.base SPEC    # prints the run's largest peak resident bytes as JSON
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from psgd.errors import UsageError

RANKS, BATCH, SAMPLES = 2, 8, 64
# a launcher's variables: the run, started from inside a rank, must not join that rank's job
LAUNCHER_VARIABLES = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_", "SLURM_")


def _mpiexec() -> list[str]:
    """make install's mpiexec beside this Python, else one on PATH, else none (one rank)."""
    local = Path(sys.executable).parent / "mpiexec"
    found = str(local) if local.exists() else shutil.which("mpiexec")
    return [found, "-n", str(RANKS)] if found else []


def _dataset(spec: str, path: Path) -> int:
    """Random uint8 samples of ``spec``'s input shape at ``path``; the bytes of its /train."""
    import numpy as np

    from psgd.data.layout import write_dataset
    from psgd.plan.inputs import model_of_spec, train_bytes
    model = model_of_spec(spec)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (SAMPLES, *model.input_shape), dtype=np.uint8)
    y = np.arange(SAMPLES) % model.n_classes
    write_dataset(path, x, y, x[:BATCH], y[:BATCH], n_classes=model.n_classes, scale=1 / 255,
                  source="psgd plan base")
    return train_bytes(str(path))


def _child(spec: str) -> dict:
    """Run ``spec`` for a few steps on RANKS ranks; the largest rank's peak resident bytes
    (the ranks are this process's waited-for descendants) and the run's data bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "base.h5"
        data_bytes = _dataset(spec, data)
        launch = _mpiexec()
        run = subprocess.run([*launch, sys.executable, "-m", "psgd", "train", "--data", str(data),
                              "--model", spec, "--protocol", "allreduce", "--batch-size",
                              str(BATCH), "--steps", "3", "--quiet", "--eval-samples", str(BATCH)],
                             capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"the run failed: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
    peak = 1024 * resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss     # Linux: KiB
    return {"peak": peak, "ranks": RANKS if launch else 1, "data": data_bytes}


def measure(spec: str, state, timeout: float = 300.0) -> int:
    """A rank's peak resident bytes in a short run of ``spec`` less ``state(batch)``, the
    training state it holds at that batch whatever the model's size (its parameters, gradient
    and activations), and its data slice."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_VARIABLES)}
    try:
        proc = subprocess.run([sys.executable, "-m", "psgd.plan.base", spec], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise UsageError(f"psgd plan: measuring a rank's base memory for {spec} took over "
                         f"{timeout:g} s") from None
    try:
        run = json.loads(proc.stdout.strip().splitlines()[-1])
        held = state(BATCH) + -(-int(run["data"]) // int(run["ranks"]))
        return max(0, int(run["peak"]) - held)
    except (ValueError, IndexError, KeyError):
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"psgd plan: cannot measure a rank's base memory for {spec} "
                         f"({tail})") from None


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1])))
