"""Pipeline x data parallel over parameter servers: S servers + D replicas x K stages, each
stage's replicas pushing to that stage's own servers under bsp, ssp or asp."""
import json
import shutil

import h5py
import numpy as np
import pytest

from conftest import serial_float64
from psgd.run.checkpoint import load_checkpoint

MLP = "mlp:784-45-33-10"


def train(mpirun, ranks, data, log, *flags, check=True):
    return mpirun(ranks, ["-m", "psgd", "train", "--quiet", "--data", data, "--model", MLP,
                          "--log", str(log), *map(str, flags)], timeout=240, check=check)


def records(log, kind):
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == kind]


def assert_learned(dataset, log, bound) -> dict:
    """The run in ``log`` (MLP, batch 32, lr 0.05, momentum 0.9) ends well under the untrained
    model's test loss with its step losses falling, and with ``bound`` (ssp) no push staler;
    returns its summary."""
    untrained = serial_float64(dataset, MLP, 1, 0, 32, 0.05, 0.9)[1]
    summary = records(log, "summary")[0]
    assert summary["test_loss"] < untrained - 0.3
    steps = [r["loss"] for r in records(log, "step")]
    assert steps[-1] < steps[0]
    if bound is not None:
        assert max(summary["pipeline"]["max_staleness"]) <= bound
    return summary


@pytest.mark.parametrize("ranks, replicas, servers, schedule, microbatches", [
    (6, 2, 2, "gpipe", 4),    # 2 servers + 2 replicas x 2 stages
    (6, 1, 4, "1f1b", 2),     # 4 servers (2 shards per stage) + 1 replica x 2 stages
])
def test_bsp_servers_of_each_stage_equal_serial_sgd_on_the_union_of_the_batches(
        mpirun, dataset, tmp_path, ranks, replicas, servers, schedule, microbatches):
    """bsp steps each stage's shards once per clock with the mean of its replicas' pushes
    (each the mean over its microbatches): every step's loss and the test loss are serial
    momentum SGD's on the union of the batches, to float32 round-off."""
    steps, batch, lr, mu = 10, 16, 0.0625, 0.875
    log = tmp_path / "run.jsonl"
    train(mpirun, ranks, dataset, log, "--pipeline", 2, "--microbatches", microbatches,
          "--schedule", schedule, "--protocol", "bsp", "--servers", servers, "--optimizer",
          "momentum", "--momentum", mu, "--lr", lr, "--lr-schedule", "constant",
          "--batch-size", batch, "--steps", steps, "--log-every", 1)
    losses, test_loss = serial_float64(dataset, MLP, replicas, steps, batch, lr, mu)
    np.testing.assert_allclose([r["loss"] for r in records(log, "step")], losses[:, 0],
                               rtol=1e-5)   # the lead replica's loss
    summary = records(log, "summary")[0]
    assert summary["test_loss"] == pytest.approx(test_loss, rel=1e-5)
    assert summary["pipeline"]["replicas"] == replicas
    assert summary["pipeline"]["max_staleness"] == [0, 0]
    untrained = serial_float64(dataset, MLP, replicas, 0, batch, lr, mu)[1]
    assert abs(test_loss - untrained) > 1e-3   # the steps moved the model


@pytest.mark.parametrize("protocol, bound", [("ssp", 1), ("asp", None)])
def test_asynchronous_servers_of_each_stage_train_and_ssp_keeps_its_bound(
        mpirun, dataset, tmp_path, protocol, bound):
    log = tmp_path / "run.jsonl"
    staleness = ["--staleness", bound] if bound is not None else []
    train(mpirun, 6, dataset, log, "--pipeline", 2, "--microbatches", 2, "--protocol", protocol,
          "--servers", 2, *staleness, "--optimizer", "momentum", "--lr", 0.05,
          "--batch-size", 32, "--steps", 60, "--log-every", 10)
    assert_learned(dataset, log, bound)


@pytest.mark.parametrize("ranks, flags, line", [
    (6, ["--protocol", "ssp", "--servers", 2, "--schedule", "pipedream"],
     "--protocol ssp does not combine the replicas of a --schedule pipedream pipeline: "
     "pipedream and pipemare step a stage after every microbatch"),
    (2, ["--protocol", "gossip"], "--protocol gossip does not combine the replicas of a "
     "--schedule 1f1b pipeline: every worker keeps a model of its own"),
    (4, ["--protocol", "hogwild", "--servers", 2], "--protocol hogwild does not combine"),
    (3, ["--protocol", "bsp", "--servers", 1], "--servers 1: each of the 2 model parts"),
    (5, ["--protocol", "bsp", "--servers", 2],
     "--pipeline 2: the 5 ranks are not 2 servers + D replicas x 2 stages"),
    (2, ["--staleness", 2], "--staleness does not work under --pipeline: its protocol combines"),
])
def test_a_protocol_or_grid_the_stage_replicas_cannot_run_is_one_line(mpirun, dataset, tmp_path,
                                                                      ranks, flags, line):
    out = train(mpirun, ranks, dataset, tmp_path / "x.jsonl", "--pipeline", 2, "--steps", 2,
                "--batch-size", 16, *flags, check=False)
    errors = [x for x in out.stderr.splitlines() if "error" in x]
    assert out.returncode != 0 and len(errors) == 1 and line in errors[0], out.stderr


def test_a_resumed_bsp_pipeline_over_servers_ends_bit_equal_to_the_unbroken_run(
        mpirun, dataset, tmp_path):
    """2 servers + 1 replica x 2 stages, momentum: the servers' parameters and velocity go
    into the checkpoints (each stage's first server sends its stage's slice); the run
    resumed from step 4 ends where the one that wrote it does, bit for bit."""
    a, b = tmp_path / "a", tmp_path / "b"
    flags = ["--pipeline", 2, "--microbatches", 2, "--batch-size", 16, "--protocol", "bsp",
             "--servers", 2, "--optimizer", "momentum", "--lr", 0.05, "--steps", 8]
    train(mpirun, 4, dataset, tmp_path / "a.jsonl", *flags, "--checkpoint-dir", a,
          "--checkpoint-every", 4)
    train(mpirun, 4, dataset, tmp_path / "b.jsonl", *flags, "--checkpoint-dir", b,
          "--resume", a / "ckpt-00000004.h5")
    mid, one, two = (load_checkpoint(p) for p in (a / "ckpt-00000004.h5", a / "ckpt-00000008.h5",
                                                  b / "ckpt-00000008.h5"))
    assert one.step == two.step == 8 and mid.step == 4
    assert np.abs(mid.opt_state["velocity"]).max() > 0
    assert not np.array_equal(mid.params, one.params)
    assert np.array_equal(one.params, two.params)
    assert np.array_equal(one.opt_state["velocity"], two.opt_state["velocity"])


@pytest.mark.parametrize("protocol", ["ssp", "asp"])
def test_an_asynchronous_pipeline_over_servers_resumes_at_its_step_with_its_state(
        mpirun, dataset, tmp_path, protocol):
    """2 servers + 1 replica x 2 stages, momentum 0.5: run a writes step 4's checkpoint.  Resumed
    from it with --lr 1e-30 (so the parameters stay and the gradients are fixed), the run logs
    steps 5..8, ends on step 4's parameters (to 1e-20), and its velocities minus those of the
    same run resumed from a copy whose optimizer state is zeroed are 0.5^4 times step 4's: the
    servers of both stages took the saved parameters and optimizer state (one replica, so the
    order of the pushes is fixed)."""
    a, b, z = tmp_path / "a", tmp_path / "b", tmp_path / "z"
    flags = ["--pipeline", 2, "--microbatches", 2, "--batch-size", 16, "--protocol", protocol,
             "--servers", 2, "--optimizer", "momentum", "--momentum", 0.5, "--steps", 8,
             "--lr-schedule", "constant", "--log-every", 1]
    train(mpirun, 4, dataset, tmp_path / "a.jsonl", *flags, "--lr", 0.05, "--checkpoint-dir", a,
          "--checkpoint-every", 4)
    shutil.copytree(a, z)
    for part in z.glob("ckpt-00000004.part-*.h5"):
        with h5py.File(part, "r+") as f:
            for array in f["optimizer"].values():   # the optimizer's and dana's velocities
                array[...] = 0
    for out, source in ((b, a), (z / "run", z)):
        train(mpirun, 4, dataset, tmp_path / f"{out.name}.jsonl", *flags, "--lr", 1e-30,
              "--checkpoint-dir", out, "--resume", source / "ckpt-00000004.h5")
    mid, end, zeroed = (load_checkpoint(d / name) for d, name in (
        (a, "ckpt-00000004.h5"), (b, "ckpt-00000008.h5"), (z / "run", "ckpt-00000008.h5")))
    assert [r["step"] for r in records(tmp_path / "b.jsonl", "step")] == [5, 6, 7, 8]
    assert np.abs(end.params - mid.params).max() < 1e-20   # parameters at 0 move by lr * v
    assert np.abs(mid.opt_state["velocity"]).max() > 0
    for key in ("velocity", "dana_velocity_0"):   # dana: momentum's default compensation
        np.testing.assert_allclose(end.opt_state[key] - zeroed.opt_state[key],
                                   0.5 ** 4 * mid.opt_state[key], rtol=1e-4, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("protocol, bound", [("asp", []), ("ssp", ["--staleness", 1])])
def test_a_resumed_pipeline_of_two_replicas_replays_to_the_unbroken_runs_state_bit_for_bit(
        mpirun, dataset, tmp_path, protocol, bound):
    """2 servers + 2 replicas x 2 stages, momentum 0.5 (dana: each replica's own velocity on
    its stage's server): run u records its servers' order (--record) and writes step 4's
    checkpoint; run r resumes from it with --replay and ends bit-equal to u: parameters and
    each replica's velocity, both stages.  It takes each stage's servers holding a
    checkpoint's next clock until every replica's push of the clock before is in (the
    checkpoint is one clock's state, and the record cuts there), dana's delays before the
    cut counted again into its running means, and its sum of the velocities re-summed at each
    checkpoint, as a resumed run sums it.  Without --replay the order of the replicas'
    pushes is the replicas' timing, and dana scales each push by its delay."""
    u, r = tmp_path / "u", tmp_path / "r"
    flags = ["--pipeline", 2, "--microbatches", 2, "--batch-size", 16, "--protocol", protocol,
             *bound, "--servers", 2, "--optimizer", "momentum", "--momentum", 0.5, "--steps", 8,
             "--lr", 0.05, "--lr-schedule", "constant", "--checkpoint-every", 4]
    train(mpirun, 6, dataset, tmp_path / "u.jsonl", *flags, "--checkpoint-dir", u,
          "--record", tmp_path / "order.h5")
    train(mpirun, 6, dataset, tmp_path / "r.jsonl", *flags, "--checkpoint-dir", r,
          "--resume", u / "ckpt-00000004.h5", "--replay", tmp_path / "order.h5")
    mid, one, two = (load_checkpoint(p) for p in (u / "ckpt-00000004.h5", u / "ckpt-00000008.h5",
                                                  r / "ckpt-00000008.h5"))
    assert two.step == 8 and not np.array_equal(mid.params, one.params)
    assert np.array_equal(one.params, two.params)
    for key in ("dana_velocity_0", "dana_velocity_1"):
        assert np.abs(mid.opt_state[key]).max() > 0
        assert np.array_equal(one.opt_state[key], two.opt_state[key]), key


@pytest.mark.slow
def test_a_replay_of_another_runs_record_is_one_line_on_every_rank(mpirun, dataset, tmp_path):
    """A resumed --replay of a record made with other settings: one line, nothing left running."""
    a = tmp_path / "a"
    flags = ["--pipeline", 2, "--microbatches", 2, "--batch-size", 16, "--protocol", "asp",
             "--servers", 2, "--optimizer", "momentum", "--steps", 6]
    train(mpirun, 4, dataset, tmp_path / "a.jsonl", *flags, "--checkpoint-dir", a,
          "--checkpoint-every", 2, "--record", tmp_path / "order.h5")
    out = train(mpirun, 4, dataset, tmp_path / "b.jsonl", *flags, "--steps", 5,
                "--resume", a / "ckpt-00000002.h5", "--replay", tmp_path / "order.h5", check=False)
    errors = [x for x in out.stderr.splitlines() if "error" in x]
    assert out.returncode != 0 and len(errors) == 1, out.stderr
    assert "--replay" in errors[0] and "steps 6" in errors[0] and "steps 5" in errors[0]


def test_an_asp_pipeline_of_two_replicas_resumes_and_finishes(mpirun, dataset, tmp_path):
    """2 servers + 2 replicas x 2 stages under asp: the resumed run starts at step 4 and ends
    at 8 with a finite state (its order of pushes is its own: not bit-equal)."""
    a, b = tmp_path / "a", tmp_path / "b"
    flags = ["--pipeline", 2, "--microbatches", 2, "--batch-size", 16, "--protocol", "asp",
             "--servers", 2, "--optimizer", "momentum", "--lr", 0.05, "--steps", 8,
             "--log-every", 1]
    train(mpirun, 6, dataset, tmp_path / "a.jsonl", *flags, "--checkpoint-dir", a,
          "--checkpoint-every", 4)
    train(mpirun, 6, dataset, tmp_path / "b.jsonl", *flags, "--checkpoint-dir", b,
          "--resume", a / "ckpt-00000004.h5")
    assert [r["step"] for r in records(tmp_path / "b.jsonl", "step")] == [5, 6, 7, 8]
    mid, end = load_checkpoint(a / "ckpt-00000004.h5"), load_checkpoint(b / "ckpt-00000008.h5")
    assert end.step == 8 and np.isfinite(end.opt_state["velocity"]).all()
    assert not np.array_equal(end.params, mid.params)
