"""A SIGKILL during a checkpoint write leaves the previous checkpoints intact, and training resumes."""
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import MPI_DIR, write_synth

from psgd.nn.model import build_model
from psgd.run.checkpoint import list_checkpoints, load_checkpoint

BIG = "mlp:784-2048-2048-10"   # 5.8M parameters: a 23 MB file, about 0.1 s to write
KILLS = 6


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_synth(tmp_path_factory.mktemp("data") / "synth.h5", 400, 100)


def _kill_mid_write(directory, n_params, rng):
    """Start the writer, let it save at least once, SIGKILL it while a temp file is open.

    Returns whether a temp file was left behind (the kill landed inside a write).
    """
    proc = subprocess.Popen([sys.executable, str(MPI_DIR / "ckpt_writer.py"), str(directory), BIG,
                             str(n_params)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("saved"), "the writer saved nothing"
        deadline = time.monotonic() + 20
        while not list(directory.glob(".ckpt-*.h5.tmp")):  # a write has begun
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.06))  # somewhere inside the ~0.1 s write
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    return bool(list(directory.glob(".ckpt-*.h5.tmp")))


def test_sigkill_during_checkpoint_write_keeps_previous_and_resume_works(mpirun, dataset,
                                                                          tmp_path):
    n_params = build_model(BIG).n_params
    directory = tmp_path / "ck"
    directory.mkdir()
    rng = random.Random(1234)
    newest_step = 0
    mid_write = 0
    for _ in range(KILLS):
        mid_write += _kill_mid_write(directory, n_params, rng)
        found = list_checkpoints(directory)
        assert found, "no complete checkpoint survived"
        for path in found:  # every complete checkpoint loads and is whole
            ck = load_checkpoint(path)
            assert ck.params.shape == (n_params,) and ck.model_spec == BIG
            assert ck.params[ck.step % n_params] == ck.step
        newest = load_checkpoint(found[-1])
        assert newest.step >= newest_step  # nothing older replaced a newer one
        newest_step = newest.step
    assert mid_write >= KILLS // 2, f"only {mid_write} of {KILLS} kills landed inside a write"
    proc = mpirun(1, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--model", BIG,
                      "--protocol", "allreduce", "--optimizer", "sgd", "--batch-size", 16,
                      "--steps", newest_step + 2, "--resume", directory,
                      "--checkpoint-dir", directory], timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    final = load_checkpoint(list_checkpoints(directory)[-1])
    assert final.step == newest_step + 2
    assert np.all(np.isfinite(final.params))
    assert not list(directory.glob(".ckpt-*.h5.tmp")), "stale temp files were not removed"
