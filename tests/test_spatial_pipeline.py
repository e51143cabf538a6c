"""Pipelines of stages split by image rows (ranks = D x K x P, --pipeline K --spatial P) against
serial float64 training on the same microbatches, and what they refuse."""
import json

import numpy as np
import pytest

from test_tensor_pipeline import rel, train

BN_NET = "conv:8x3:pad1-bn-relu-pool:2-conv:8x3:pad1-bn-relu-pool:2-flatten-dense:10"
NET = "conv:6x5:pad2-relu-pool:2-conv:8x3:pad1-relu-pool:2-flatten-dense:10"


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("ranks,args", [
    (4, ["lenet", 2, 2, 2, "gpipe", 3, "spatial", "3,5", 28]),   # K=2, P=2 (lenet: 28 x 28)
    (4, [BN_NET, 2, 2, 2, "1f1b", 3, "spatial", "4,5", 13]),     # batch norm; 13 rows: 7, 6
    (6, [NET, 2, 3, 2, "1f1b", 2, "spatial", "3,4", 20]),        # P=3: 7, 7, 6 rows; then 4, 3, 3
    (4, [BN_NET, 1, 2, 2, "gpipe", 2, "spatial", "9", 12]),      # D=2 replicas of K=1, P=2
    (4, [NET, 2, 2, 4, "pipedream", 2, "spatial", "3,4", 12]),   # the unsplit async reference
    (4, [NET, 2, 2, 4, "pipemare", 2, "spatial", "3,4", 12]),
])
def test_spatially_split_stages_train_as_serial_float64(mpirun, ranks, args):
    proc = mpirun(ranks, ["tensor_pipeline_check.py", *args], timeout=300)
    assert rel(proc.stdout, "relative |grid - serial|") < 1e-12, proc.stdout
    assert rel(proc.stdout, "test loss relative") < 1e-12, proc.stdout
    assert rel(proc.stdout, "moved") > 1e-3, proc.stdout   # the steps changed the parameters


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("model,flags", [
    ("lenet", ["--schedule", "gpipe", "--microbatches", 2]),   # the auto cut: a conv in each stage
    (BN_NET, ["--schedule", "1f1b", "--partition", "4,5"]),   # batch norm: one microbatch
])
def test_cli_pipeline_of_spatial_stages_trains_as_serial_float64(mpirun, dataset, tmp_path,
                                                                 model, flags):
    """`psgd train --pipeline 2 --spatial 2 --dtype float64` on 4 ranks: every step's loss and
    the test loss equal serial float64 momentum SGD on the same batches to 1e-12 relative."""
    from conftest import serial_float64
    log = tmp_path / "log.jsonl"
    proc = mpirun(4, train(dataset, log, "--model", model, "--dtype", "float64", "--spatial", 2,
                           *flags), timeout=300)
    assert "psgd: pipeline of 2 stages x 2 spatial parts x 1 replica(s)" in proc.stdout, proc.stdout
    records = [json.loads(line) for line in log.read_text().splitlines()]
    losses = np.array([r["loss"] for r in records if r["kind"] == "step"])
    test_loss = next(r for r in records if r["kind"] == "summary")["test_loss"]
    want, want_test = serial_float64(dataset, model, 1, 6, 16, 0.05, 0.9)
    assert np.max(np.abs(losses - want[:, 0]) / np.abs(want[:, 0])) < 1e-12
    assert abs(test_loss - want_test) / abs(want_test) < 1e-12


THIN = "conv:4x3:pad1-relu-pool:2-pool:2-pool:2-conv:4x5:pad2-relu-flatten-dense:10"


@pytest.mark.mpi
@pytest.mark.parametrize("flags,message", [
    (["--model", "lenet", "--partition", "6,2"],
     "--spatial 2 under --pipeline: the stage of layers 8..9 (Dense .. Dense) takes no image"),
    (["--model", "lenet", "--partition", "5,3"],
     "the stage of layers 7..9 (Flatten .. Dense) has no conv or pool layer to split by rows"),
    (["--model", THIN, "--partition", "5,3"],
     "would leave rank 0 2 input rows of 3 (at least 5, the kernel height, needed)"),
    (["--model", "mlp:784-32-10"], "--spatial needs a model with conv layers"),
    (["--model", "lenet", "--schedule", "pipedream", "--stage-comp", "dcasgd"],
     "--stage-comp dcasgd does not work with stages split by --spatial"),
    (["--model", "lenet", "--recompute", "off"],
     "--recompute off does not work with stages split by rows"),
    (["--model", "lenet", "--protocol", "bsp", "--servers", 2],
     "the servers of stages split by rows are not built"),
])
def test_what_spatial_stages_do_not_run_is_refused_in_one_line(mpirun, dataset, tmp_path, flags,
                                                               message):
    proc = mpirun(4, train(dataset, tmp_path / "l.jsonl", "--spatial", 2, *flags), timeout=60,
                  check=False)
    errors = [l for l in proc.stderr.splitlines() if "error" in l]
    assert proc.returncode != 0 and len(errors) == 1 and message in errors[0], proc.stderr
