"""What the server job of an elastic run writes: its port file, checkpoints and the final
evaluation (shared by the servers and a ring's coordinator)."""
from __future__ import annotations

import os

import numpy as np

from psgd.mpi.phase import phase
from psgd.run.checkpoint import Checkpoint, save_checkpoint


def publish(port: str, path: str, transports: str = "", say: bool = True) -> None:
    """Write the port name to ``path`` (atomically: a joiner never reads half of it), and on a
    second line the ``UCX_TLS=...`` a joiner must start MPI with, if any; ``say``: print how
    workers join."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(port + "\n" + (transports + "\n" if transports else ""))
    os.replace(tmp, path)
    if say:
        print(f"psgd: elastic server ready: workers join with `mpiexec -n 1 psgd join "
              f"--port-file {path}`", flush=True)


def save(job, updates: int, clock: int, params: np.ndarray, opt_state: dict | None):
    """An elastic run's checkpoint: its step is the updates applied (what --steps counts),
    its one clock the servers' (where the workers go on after a resume)."""
    s = job.settings
    with phase("writing a checkpoint"):
        return save_checkpoint(s.checkpoint_dir, Checkpoint(
            params=np.asarray(params, np.float32), model_spec=s.model, step=int(updates),
            optimizer=s.optimizer, opt_state=dict(opt_state or {}), clocks=np.asarray([clock]),
            protocol=s.protocol, seed=s.seed, config=s.as_dict(), run_id=job.run_id),
            keep=s.checkpoint_keep)


def evaluate(job, params: np.ndarray) -> tuple[float, float]:
    """The test loss and accuracy of ``params`` (the job's model set to them)."""
    from psgd.data.reader import ShardReader
    from psgd.nn.model import CALIBRATION_SAMPLES
    s, model = job.settings, job.model
    model.params[:] = params
    reader = ShardReader(s.data, 0, 1, s.batch_size, seed=s.seed)
    model.set_calibration(reader.calibration_rows(CALIBRATION_SAMPLES)[0])
    x, y = reader.test_set()
    if s.eval_samples:
        x, y = x[:s.eval_samples], y[:s.eval_samples]
    return model.evaluate(x, y)
