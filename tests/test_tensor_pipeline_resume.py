"""Checkpoints of tensor-split pipeline stages (psgd.run.tensor_pipeline_checkpoint): a resumed
run ends bit-equal to the unbroken one, and a set cut off while written is never resumed from."""
import json
import shutil

import h5py
import numpy as np
import pytest

from psgd.run.checkpoint import load_checkpoint
from psgd.run.checkpoint_parts import part_name
from psgd.run.pipeline_checkpoint import DELTA

MLP = "mlp:784-32-30-16-10"   # width 30 over 2 parts, the 16-wide pair


def train(data, *flags):
    return ["-m", "psgd", "train", "--quiet", "--data", data, "--model", MLP, "--batch-size", 16,
            "--lr", 0.05, "--optimizer", "momentum", "--pipeline", 2, "--tensor", 2,
            "--partition", "2,2", *flags]


@pytest.mark.slow
@pytest.mark.parametrize("schedule,micro", [("gpipe", 4), ("1f1b", 2), ("pipemare", 2)])
def test_split_stages_resume_bit_equal_and_skip_a_cut_off_set(mpirun, dataset, tmp_path,
                                                              schedule, micro):
    """4 ranks (K = 2 stages x T = 2 parts), checkpoints every 2 of 8 steps.  The set is an
    unsplit pipeline's: stage 0's part holds the serial values of its layers.  With the step-8
    set cut off before its manifest and the step-6 set missing a part, --resume auto goes on
    from step 4 and ends bit-equal to the unbroken run (parameters and momentum)."""
    a, c, log = tmp_path / "a", tmp_path / "c", tmp_path / "c.jsonl"
    flags = ["--steps", 8, "--schedule", schedule, "--microbatches", micro,
             "--checkpoint-every", 2]
    mpirun(4, train(dataset, *flags, "--checkpoint-dir", a), timeout=180)
    one = load_checkpoint(a / "ckpt-00000008.h5")
    assert one.params.size == 784 * 32 + 32 + 32 * 30 + 30 + 30 * 16 + 16 + 16 * 10 + 10
    assert np.isfinite(one.params).all() and np.isfinite(one.opt_state["velocity"]).all()
    first = 784 * 32 + 32 + 32 * 30 + 30   # stage 0: the first two dense layers, whole
    with h5py.File(a / part_name(8, 0)) as f:
        assert np.array_equal(f["params"][:], one.params[:first])
    shutil.copytree(a, c)
    (c / "ckpt-00000008.h5").unlink()
    (c / part_name(6, 1)).unlink()
    mpirun(4, train(dataset, *flags, "--checkpoint-dir", c, "--resume", "auto", "--log", log,
                    "--log-every", 1), timeout=180)
    steps = [json.loads(l)["step"] for l in log.read_text().splitlines() if '"step"' in l]
    assert steps[0] == (8 if schedule == "pipemare" else 5)   # an asynchronous run logs its end
    two = load_checkpoint(c / "ckpt-00000008.h5")
    assert np.array_equal(one.params, two.params)
    assert np.array_equal(one.opt_state["velocity"], two.opt_state["velocity"])
    if schedule == "pipemare":   # its discrepancy-correction state, gathered as the velocity is
        assert np.array_equal(one.opt_state[DELTA], two.opt_state[DELTA])
    assert one.opt_state["steps"] == two.opt_state["steps"] == (8 * micro if schedule == "pipemare" else 8)
