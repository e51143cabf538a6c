"""--recompute off with tensor-split pipeline stages: the activation store keeps the split
layers' state (inside the split convs too), so a backward runs no second forward and the run
is the --recompute on run bit for bit."""
import json

import numpy as np
import pytest

from psgd.run.checkpoint import load_checkpoint

CONV = "conv:4x3:pad1-bn-relu-conv:6x3:pad1-relu-pool:2-flatten-dense:16-relu-dense:10"


def records(log, kind):
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == kind]


@pytest.mark.slow
@pytest.mark.parametrize("model, cut, schedule, microbatches", [
    (CONV, "5,3", "1f1b", 4),        # conv pair (column + local bn, row) | dense pair
    ("resnet8", "4,4", "gpipe", 2),  # residual blocks split inside
    (CONV, "5,3", "pipedream", 2),   # stashed weights: the row conv's backward on the forward's
])
def test_recompute_off_with_split_stages_equals_recompute_on_and_reports_the_stored_bytes(
        mpirun, dataset, tmp_path, model, cut, schedule, microbatches):
    """2 stages x 2 parts, float32: the step losses, test loss and step-4 checkpoint
    (parameters, velocity) of --recompute off equal --recompute on's bit for bit, and every
    stage reports more peak activation bytes (the store's layer buffers).  The cut is given
    (--partition auto times the units, and prices the two modes apart)."""
    out = {}
    for mode in ("on", "off"):
        log, ckpt = tmp_path / f"{mode}.jsonl", tmp_path / mode
        stdout = mpirun(4, ["-m", "psgd", "train", "--quiet", "--data", dataset, "--model", model,
                            "--pipeline", 2, "--partition", cut, "--tensor", 2,
                            "--microbatches", microbatches,
                            "--schedule", schedule, "--recompute", mode, "--batch-size", 16,
                            "--steps", 4, "--optimizer", "momentum", "--lr", 0.05,
                            "--log-every", 1, "--log", log, "--checkpoint-dir", ckpt],
                        timeout=240).stdout
        assert f"--recompute {mode}" in stdout, stdout
        out[mode] = (records(log, "step"), records(log, "summary")[0],
                     load_checkpoint(ckpt / "ckpt-00000004.h5"))
    (steps_on, summary_on, on), (steps_off, summary_off, off) = out["on"], out["off"]
    assert [r["loss"] for r in steps_on] == [r["loss"] for r in steps_off]
    assert summary_on["test_loss"] == summary_off["test_loss"]
    assert np.array_equal(on.params, off.params)
    assert np.array_equal(on.opt_state["velocity"], off.opt_state["velocity"])
    assert np.abs(on.opt_state["velocity"]).max() > 0
    kept = summary_off["pipeline"]["activation_bytes"]
    again = summary_on["pipeline"]["activation_bytes"]
    assert all(a > b for a, b in zip(kept, again)), (kept, again)
