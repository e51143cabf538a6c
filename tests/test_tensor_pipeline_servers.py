"""Pipelines of tensor-split stages over parameter servers: S servers + D replicas x K stages x
T parts, each (stage, part)'s replicas pushing the part's own vector to its own shards."""
import shutil

import h5py
import numpy as np
import pytest

from conftest import serial_float64
from test_pipeline_servers import assert_learned, records

from psgd.run.checkpoint import load_checkpoint

MLP = "mlp:784-45-33-10"


def train(mpirun, ranks, data, log, *flags, check=True):
    return mpirun(ranks, ["-m", "psgd", "train", "--quiet", "--data", data, "--model", MLP,
                          "--log", str(log), "--pipeline", 2, "--tensor", 2,
                          *map(str, flags)], timeout=240, check=check)


@pytest.mark.parametrize("ranks", [2, 3])
def test_each_part_takes_part_0s_copies_after_every_pull(mpirun, ranks):
    """ssp/asp: a stand-in worker pulls different values into each part; after start and
    step the row layer's bias (the copies) is part 0's on every part, the rest the part's
    own (3 parts: uneven widths, the copies at other local offsets)."""
    out = mpirun(ranks, ["tensor_pipeline_copies_check.py", "mlp:784-33-24-10"], timeout=60).stdout
    assert "copies 24" in out and "wrong 0" in out, out


@pytest.mark.slow
def test_bsp_servers_of_each_stage_part_end_bit_equal_to_the_allreduce_pipeline(
        mpirun, dataset, tmp_path):
    """4 servers + 2 replicas x 2 stages x 2 parts under bsp: each (stage, part)'s servers
    average its 2 replicas' pushes (each the mean over 2 microbatches) and step momentum
    once; with powers of two the scalings are exact, so the checkpoints of steps 3 and 6
    (parameters and velocity, from the servers) equal the all-reduce pipeline's on 8 ranks
    bit for bit, and every step's loss is serial float64 SGD's to float32 round-off.  The
    cut is given: --partition auto times the units, and another cut sums in another order."""
    steps, batch, lr, mu = 6, 16, 0.0625, 0.875
    flags = ["--microbatches", 2, "--optimizer", "momentum", "--momentum", mu, "--lr", lr,
             "--lr-schedule", "constant", "--batch-size", batch, "--steps", steps,
             "--log-every", 1, "--checkpoint-every", 3, "--partition", "1,2"]
    a, b = tmp_path / "bsp", tmp_path / "ring"
    out = train(mpirun, 12, dataset, tmp_path / "a.jsonl", *flags, "--protocol", "bsp",
                "--servers", 4, "--checkpoint-dir", a).stdout
    assert "x 2 tensor parts x 2 replica(s) over 4 --protocol bsp servers" in out, out
    train(mpirun, 8, dataset, tmp_path / "b.jsonl", *flags, "--checkpoint-dir", b)
    for step in (3, 6):
        one, two = (load_checkpoint(d / f"ckpt-{step:08d}.h5") for d in (a, b))
        assert one.step == two.step == step
        np.testing.assert_array_equal(one.params, two.params, err_msg=f"step {step}")
        np.testing.assert_array_equal(one.opt_state["velocity"], two.opt_state["velocity"])
    assert np.abs(one.opt_state["velocity"]).max() > 0
    losses = serial_float64(dataset, MLP, 2, steps, batch, lr, mu)[0]
    np.testing.assert_allclose([r["loss"] for r in records(tmp_path / "a.jsonl", "step")],
                               losses[:, 0], rtol=1e-5)   # the lead replica's loss
    summary = records(tmp_path / "a.jsonl", "summary")[0]["pipeline"]
    assert summary["replicas"] == 2 and summary["max_staleness"] == [0, 0]


@pytest.mark.slow
@pytest.mark.parametrize("protocol, bound", [("ssp", 1), ("asp", None)])
def test_asynchronous_servers_of_split_stages_train_and_ssp_keeps_its_bound(
        mpirun, dataset, tmp_path, protocol, bound):
    """4 servers + 2 replicas x 2 stages x 2 parts: the run learns, ssp's pushes are at most
    its bound stale, and the final checkpoint (from the servers) is written whole."""
    log = tmp_path / "run.jsonl"
    staleness = ["--staleness", bound] if bound is not None else []
    train(mpirun, 12, dataset, log, "--microbatches", 2, "--protocol", protocol,
          "--servers", 4, *staleness, "--optimizer", "momentum", "--lr", 0.05,
          "--batch-size", 32, "--steps", 60, "--log-every", 10, "--checkpoint-dir", tmp_path)
    assert_learned(dataset, log, bound)
    end = load_checkpoint(tmp_path / "ckpt-00000060.h5")
    assert end.step == 60 and end.params.size == 37183 and np.isfinite(end.params).all()


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["ssp", "asp"])
def test_split_stages_over_servers_resume_at_their_step_with_their_state(
        mpirun, dataset, tmp_path, protocol):
    """4 servers + 1 replica x 2 stages x 2 parts, momentum 0.5: run a writes step 4's
    checkpoint.  Resumed from it with --lr 1e-30 (the parameters stay, the gradients are
    fixed), the run logs steps 5..8, ends on step 4's parameters, and its velocity minus that
    of the same run resumed from a copy whose optimizer state is zeroed is 0.5^4 times step
    4's: every (stage, part)'s servers took the part's saved parameters and optimizer state."""
    a, b, z = tmp_path / "a", tmp_path / "b", tmp_path / "z"
    flags = ["--microbatches", 2, "--batch-size", 16, "--protocol", protocol, "--servers", 4,
             "--optimizer", "momentum", "--momentum", 0.5, "--steps", 8,
             "--lr-schedule", "constant", "--log-every", 1]
    train(mpirun, 8, dataset, tmp_path / "a.jsonl", *flags, "--lr", 0.05, "--checkpoint-dir", a,
          "--checkpoint-every", 4)
    shutil.copytree(a, z)
    for part in z.glob("ckpt-00000004.part-*.h5"):
        with h5py.File(part, "r+") as f:
            for array in f["optimizer"].values():
                array[...] = 0
    for out, source in ((b, a), (z / "run", z)):
        train(mpirun, 8, dataset, tmp_path / f"{out.name}.jsonl", *flags, "--lr", 1e-30,
              "--checkpoint-dir", out, "--resume", source / "ckpt-00000004.h5")
    mid, end, zeroed = (load_checkpoint(d / name) for d, name in (
        (a, "ckpt-00000004.h5"), (b, "ckpt-00000008.h5"), (z / "run", "ckpt-00000008.h5")))
    assert [r["step"] for r in records(tmp_path / "b.jsonl", "step")] == [5, 6, 7, 8]
    assert np.abs(end.params - mid.params).max() < 1e-20
    assert np.abs(mid.opt_state["velocity"]).max() > 0
    np.testing.assert_allclose(end.opt_state["velocity"] - zeroed.opt_state["velocity"],
                               0.5 ** 4 * mid.opt_state["velocity"], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("ranks, flags, line", [
    (6, ["--protocol", "bsp", "--servers", 2], "--servers 2: each of the 4 model parts has "
     "servers of its own, give a multiple of 4"),
    (8, ["--protocol", "asp", "--servers", 4, "--dtype", "float64"],
     "--dtype float64: the parameter servers hold float32"),
    (8, ["--protocol", "asp", "--servers", 4, "--record", "r.h5"],
     "--record does not work with tensor-split stages over servers"),
    (8, ["--protocol", "ssp", "--servers", 4, "--schedule", "pipedream"],
     "--protocol ssp does not combine the replicas of a --schedule pipedream pipeline"),
    (7, ["--protocol", "bsp", "--servers", 4],
     "the 7 ranks are not D replicas x 2 stages x 2 parts"),
])
def test_what_split_stages_over_servers_do_not_run_is_refused_in_one_line(
        mpirun, dataset, tmp_path, ranks, flags, line):
    proc = train(mpirun, ranks, dataset, tmp_path / "x.jsonl", "--steps", 2, "--batch-size", 16,
                 *flags, check=False)
    errors = [x for x in proc.stderr.splitlines() if "error" in x]
    assert proc.returncode != 0 and len(errors) == 1 and line in errors[0], proc.stderr
