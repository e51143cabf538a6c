"""Pipelines of tensor-split stages (ranks = D x K x T) against serial float64 training on the
same microbatches, and the CLI's --pipeline K --tensor T."""
import pytest


def rel(out: str, what: str) -> float:
    line = next(l for l in out.splitlines() if l.startswith(what))
    return float(line.rsplit("=", 1)[1].strip().removeprefix("np.float64(").rstrip(")"))


CONV_BN = "conv:8x3:pad1-bn-relu-pool:2-conv:8x3:pad1-bn-relu-gap-dense:10"
CONV_DROP = "conv:8x3:pad1-relu-conv:6x3:pad1-relu-pool:2-flatten-dense:16-relu-dropout:0.5-dense:10"


@pytest.mark.slow
@pytest.mark.parametrize("ranks,args", [
    (4, ["mlp:20-16-16-12-10", 2, 2, 4, "1f1b", 3]),   # K=2, T=2
    (4, [CONV_BN, 2, 2, 2, "gpipe", 3]),                # stage 0 ends on split channels: gathered
    (4, [CONV_DROP, 2, 2, 3, "1f1b", 3]),               # conv pair, dense pair, dropout
    (4, ["resnet8", 2, 2, 2, "1f1b", 2]),               # residual blocks split inside
    (4, ["mlp:20-16-16-12-10", 1, 2, 2, "gpipe", 2]),   # D=2 replicas of a K=1, T=2 grid
    (2, ["mlp:20-16-16-12-10", 1, 2, 2, "1f1b", 2]),    # K=1, T=2 on 2 ranks
    (4, ["mlp:20-16-15-12-10", 2, 2, 4, "pipedream", 3]),  # as the unsplit asynchronous pipeline
    (4, ["mlp:20-16-15-12-10", 2, 2, 4, "pipemare", 3]),
    (4, [CONV_BN, 2, 2, 2, "pipedream", 3]),
])
def test_tensor_split_stages_train_as_serial_float64(mpirun, ranks, args):
    proc = mpirun(ranks, ["tensor_pipeline_check.py", *args], timeout=300)
    assert rel(proc.stdout, "relative |grid - serial|") < 1e-9, proc.stdout
    assert rel(proc.stdout, "test loss relative") < 1e-9, proc.stdout
    assert rel(proc.stdout, "moved") > 1e-3, proc.stdout   # the steps changed the parameters


def train(dataset, log, *flags):
    return ["-m", "psgd", "train", "--quiet", "--data", dataset, "--batch-size", 16, "--lr", 0.05,
            "--optimizer", "momentum", "--momentum", 0.9, "--steps", 6, "--log-every", 1, "--pipeline", 2,
            "--log", log, *flags]


@pytest.mark.slow
@pytest.mark.parametrize("model,flags", [
    ("mlp:784-32-32-16-10", ["--tensor", 2, "--microbatches", 4, "--schedule", "gpipe"]),
    ("conv:4x3:pad1-bn-relu-pool:2-conv:4x3:pad1-relu-gap-dense:10",
     ["--grid", "1,2", "--schedule", "1f1b"]),   # batch norm: one microbatch, the serial batch
])
def test_cli_pipeline_of_tensor_split_stages_trains_as_serial_float64(mpirun, dataset, tmp_path,
                                                                       model, flags):
    """`psgd train --pipeline 2 --tensor 2` on 4 ranks: every step's loss and the test loss equal
    serial float64 momentum SGD on the same batches to 1e-9 relative."""
    import json

    from conftest import serial_float64
    log = tmp_path / "log.jsonl"
    proc = mpirun(4, train(dataset, log, "--model", model, "--dtype", "float64", *flags),
                  timeout=300)
    assert "psgd: pipeline of 2 stages x 2 tensor parts x 1 replica(s)" in proc.stdout, proc.stdout
    records = [json.loads(line) for line in log.read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "step"]
    test_loss = next(r for r in records if r["kind"] == "summary")["test_loss"]
    want, want_test = serial_float64(dataset, model, 1, 6, 16, 0.05, 0.9)
    assert losses == pytest.approx(want[:, 0].tolist(), rel=1e-9)
    assert test_loss == pytest.approx(want_test, rel=1e-9)


@pytest.mark.parametrize("ranks,flags,message", [
    (2, ["--grid", "auto"], "--grid auto does not work under --pipeline"),
    (2, ["--tensor", 2], "the 2 ranks are not D replicas x 2 stages x 2 parts"),
    (4, ["--grid", "2,2"], "--grid 2,2 with --pipeline 2: 2 x 2 x 2 = 8 ranks, but the job has 4"),
])
def test_what_tensor_split_stages_do_not_run_is_refused_in_one_line(mpirun, dataset, tmp_path,
                                                                    ranks, flags, message):
    proc = mpirun(ranks, train(dataset, tmp_path / "l.jsonl", "--model", "mlp:784-32-32-16-10",
                               *flags), timeout=60, check=False)
    errors = [l for l in proc.stderr.splitlines() if "error" in l]
    assert proc.returncode != 0 and len(errors) == 1 and message in errors[0], proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["pipedream", "pipemare"])
def test_cli_asynchronous_split_stages_train_as_the_unsplit_asynchronous_pipeline(
        mpirun, dataset, tmp_path, schedule):
    """`--pipeline 2 --tensor 2 --schedule pipedream|pipemare` (4 ranks) against the unsplit
    `--pipeline 2` run (2 ranks) of the same seed, cut and schedule, in float32: the run's mean
    loss and the test loss agree to float32 round-off."""
    import json
    out = {}
    for name, ranks, flags in (("split", 4, ["--tensor", 2]), ("whole", 2, [])):
        log = tmp_path / f"{name}.jsonl"
        mpirun(ranks, train(dataset, log, "--model", "mlp:784-32-30-16-10", "--partition", "2,2",
                            "--schedule", schedule, "--microbatches", 4, *flags), timeout=300)
        records = [json.loads(line) for line in log.read_text().splitlines()]
        out[name] = ([r["loss"] for r in records if r["kind"] == "step"],
                     next(r for r in records if r["kind"] == "summary")["test_loss"])
    assert out["split"][0] == pytest.approx(out["whole"][0], rel=1e-5)
    assert out["split"][1] == pytest.approx(out["whole"][1], rel=1e-5)
