"""Pipelines under mpiexec: the exact arithmetic over real links, the CLI end to end with a
bit-exact resume, and bad input as one line."""
import json
import shutil

import h5py
import numpy as np
import pytest

from psgd.run.checkpoint import load_checkpoint
from psgd.run.checkpoint_parts import part_name

MLP = "mlp:784-32-32-16-10"


def diff(out: str) -> float:
    line = next(l for l in out.splitlines() if l.startswith("max |pipeline - serial| = "))
    return float(line.rsplit("=", 1)[1])


@pytest.mark.slow
@pytest.mark.parametrize("ranks,args", [
    (2, ["mlp:20-16-16-12-10", 2, 4, "1f1b", 5]),
    (3, ["lenet", 3, 8, "gpipe", 3]),
    (4, ["resnet8", 4, 8, "1f1b", 2]),
    (3, ["conv:8x3:pad1-bn-relu-pool:2-conv:8x3:pad1-bn-relu-gap-dense:10", 3, 1, "gpipe", 3]),
    (3, ["mlp:20-16-16-12-10", 3, 4, "pipedream", 5]),
    (3, ["mlp:20-16-16-12-10", 3, 4, "pipemare", 5]),
    (2, ["conv:8x3:pad1-bn-relu-pool:2-conv:8x3:pad1-bn-relu-gap-dense:10", 2, 2, "pipedream", 4]),
])
def test_pipeline_over_mpi_equals_serial_exactly(mpirun, ranks, args):
    proc = mpirun(ranks, ["pipeline_check.py", *args], timeout=300)
    assert diff(proc.stdout) == 0.0, proc.stdout
    assert "streamed evaluation equal = True" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_two_replicas_of_a_two_stage_pipeline_match_serial_on_all_their_microbatches(mpirun):
    proc = mpirun(4, ["pipeline_check.py", "mlp:20-16-16-12-10", 2, 4, "1f1b", 5, "float64"],
                  timeout=300)
    assert diff(proc.stdout) < 1e-12, proc.stdout


def train(data, *flags):
    return ["-m", "psgd", "train", "--quiet", "--data", data, "--model", MLP, "--batch-size", 16,
            "--lr", 0.05, "--optimizer", "momentum", "--pipeline", 2, "--microbatches", 4, *flags]


@pytest.mark.e2e
def test_pipeline_cli_trains_logs_each_stage_and_resumes_bit_exactly(mpirun, dataset, tmp_path):
    a, b, log, tl = tmp_path / "a", tmp_path / "b", tmp_path / "log.jsonl", tmp_path / "tl.json"
    proc = mpirun(2, train(dataset, "--steps", 8, "--checkpoint-dir", a, "--checkpoint-every", 4,
                           "--log", log, "--schedule", "gpipe", "--timeline", tl), timeout=120)
    assert "psgd:   stage 1: layers" in proc.stdout and "idle per stage" in proc.stdout
    assert "--recompute off" in proc.stdout   # auto: no --memory-per-rank to keep to
    records = [json.loads(l) for l in log.read_text().splitlines()]
    summary = next(r for r in records if r["kind"] == "summary")["pipeline"]
    assert len(summary["idle"]) == 2 and all(0 <= f < 1 for f in summary["idle"])
    assert summary["peak_microbatches"] == [4, 4]
    assert [r["step"] for r in records if r["kind"] == "step"][-1] == 8
    trace = json.loads(tl.read_text())
    assert summary["measured_steps"] == 7   # the first step's one-off costs are not idle
    measured = []
    for rank in (0, 1):   # the timeline's waits are the summary's idle time
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank]
        assert sum(e["name"] == "forward" for e in spans) == 8 * 4
        waits = [e for e in spans if e["name"] in ("send", "recv")]
        waited = sum(e["dur"] for e in waits) * 1e-6
        wall = trace["otherData"]["wall_s"][str(rank)]
        assert waited / wall == pytest.approx(summary["idle_with_first_step"][rank], rel=1e-3, abs=1e-5)
        mark, = [e["ts"] + e["dur"] for e in spans if e["name"] == "start"]   # the second step
        later = sum(e["dur"] for e in waits if e["ts"] >= mark) * 1e-6
        assert later < waited
        assert later / (wall - mark * 1e-6) == pytest.approx(summary["idle"][rank], rel=1e-3, abs=1e-5)
        measured.append(wall - mark * 1e-6)
    # samples/s from the second step on: 7 steps of 16 rows over the slower stage's seconds
    assert summary["measured_samples_per_s"] == pytest.approx(7 * 16 / max(measured), rel=1e-3)
    mpirun(2, train(dataset, "--steps", 8, "--checkpoint-dir", b, "--schedule", "gpipe",
                    "--resume", a / "ckpt-00000004.h5"), timeout=120)
    one, two = load_checkpoint(a / "ckpt-00000008.h5"), load_checkpoint(b / "ckpt-00000008.h5")
    assert np.array_equal(one.params, two.params)
    assert np.array_equal(one.opt_state["velocity"], two.opt_state["velocity"])


@pytest.mark.parametrize("ranks,flags,message", [
    (2, ["--pipeline", 5], "--pipeline 5 is more stages than model mlp:784-32-32-16-10's 4 layer units"),
    (2, ["--microbatches", 3], "--microbatches 3 does not divide --batch-size 16"),
    (3, [], "--pipeline 2: the 3 ranks are not D replicas x 2 stages"),
    (2, ["--schedule", "zigzag"], "unknown --schedule 'zigzag'"),
    (2, ["--partition", "1,2"], "--partition 1,2 covers 3 layer units, but model"),
    (2, ["--compress", "topk:0.1"], "--compress does not work under --pipeline"),
    (2, ["--protocol", "adpsgd"], "--protocol adpsgd does not combine the replicas"),
    (2, ["--memory-per-rank", "10k"], "no cut into 2 stages fits --memory-per-rank 10240"),
    (2, ["--weight-stashing", "off"], "--weight-stashing applies to --schedule pipedream, not 1f1b"),
    (2, ["--schedule", "pipemare", "--recompute", "off"], "--recompute off needs the backward on"),
])
def test_bad_pipeline_input_is_one_line(mpirun, dataset, ranks, flags, message):
    proc = mpirun(ranks, train(dataset, "--steps", 2, *flags), timeout=60, check=False)
    assert proc.returncode != 0
    errors = [l for l in proc.stderr.splitlines() if "error" in l]
    assert len(errors) == 1 and message in errors[0], proc.stderr


@pytest.mark.parametrize("comp,keys", [([], ()), (["--stage-comp", "dcasgd"], ("dcasgd_meansq",))])
def test_a_resumed_pipemare_run_continues_its_rescheduling_and_ends_as_the_unbroken_run(
        mpirun, dataset, tmp_path, comp, keys):
    """K = 3 (stage 0 is 2 updates behind, so T1 scales its rate), M = 4, 8 steps (32
    microbatches), the rescheduling over 40.  The unbroken run drains at each
    --checkpoint-every 2; the run resumed at step 4 (microbatch 16) takes up the global
    microbatch count and T2's estimate (and --stage-comp dcasgd's mean square), so it ends
    bit-equal."""
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["-m", "psgd", "train", "--quiet", "--data", dataset, "--model", MLP,
              "--batch-size", 16, "--lr", 0.05, "--optimizer", "momentum", "--pipeline", 3,
              "--microbatches", 4, "--schedule", "pipemare", "--pipemare-anneal", 40,
              "--steps", 8, *comp]
    mpirun(3, [*common, "--checkpoint-dir", a, "--checkpoint-every", 2], timeout=120)
    mpirun(3, [*common, "--checkpoint-dir", b, "--resume", a / "ckpt-00000004.h5"], timeout=120)
    one, two = load_checkpoint(a / "ckpt-00000008.h5"), load_checkpoint(b / "ckpt-00000008.h5")
    for key in ("velocity", "pipemare_delta", *keys):
        assert np.abs(one.opt_state[key]).max() > 0 or key == "velocity"
        assert np.array_equal(one.opt_state[key], two.opt_state[key]), key
    assert np.array_equal(one.params, two.params)
    assert np.abs(one.opt_state["pipemare_delta"]).max() > 0


def test_checkpoints_pass_between_pipeline_and_data_parallel_bit_exactly(mpirun, dataset, tmp_path):
    """M = 1, one replica: a pipeline step is the single worker's step, so either run resumes
    the other's checkpoint and ends where the uninterrupted one does."""
    common = ["-m", "psgd", "train", "--quiet", "--data", dataset, "--model", "mlp:784-64-64-10",
              "--batch-size", 32, "--lr", 0.05, "--optimizer", "momentum", "--steps", 8]
    pipe, dp = ["--pipeline", 2, "--microbatches", 1], ["--protocol", "allreduce"]
    for first, second, ranks in ((pipe, dp, (2, 1)), (dp, pipe, (1, 2))):
        a, b = tmp_path / f"a{ranks[0]}", tmp_path / f"b{ranks[0]}"
        mpirun(ranks[0], [*common, *first, "--checkpoint-dir", a, "--checkpoint-every", 4])
        mpirun(ranks[1], [*common, *second, "--checkpoint-dir", b, "--resume", a / "ckpt-00000004.h5"])
        one, two = load_checkpoint(a / "ckpt-00000008.h5"), load_checkpoint(b / "ckpt-00000008.h5")
        assert np.array_equal(one.params, two.params)
        assert np.array_equal(one.opt_state["velocity"], two.opt_state["velocity"])


def test_kept_activations_train_as_recomputed_ones_bit_exactly_and_hold_more_bytes(
        mpirun, dataset, tmp_path):
    """gpipe, K = 2, M = 4: --recompute off ends on the parameters --recompute on does (the
    same arithmetic, each forward run once) and its summary counts the kept layer buffers."""
    ends, held = {}, {}
    for recompute in ("on", "off"):
        d, log = tmp_path / recompute, tmp_path / f"{recompute}.jsonl"
        mpirun(2, train(dataset, "--steps", 4, "--schedule", "gpipe", "--recompute", recompute,
                        "--checkpoint-dir", d, "--log", log), timeout=120)
        ends[recompute] = load_checkpoint(d / "ckpt-00000004.h5")
        held[recompute] = next(json.loads(l) for l in log.read_text().splitlines()
                               if '"summary"' in l)["pipeline"]["activation_bytes"]
    assert np.array_equal(ends["on"].params, ends["off"].params)
    assert np.array_equal(ends["on"].opt_state["velocity"], ends["off"].opt_state["velocity"])
    assert all(off > on for on, off in zip(held["on"], held["off"]))


def test_a_pipeline_flag_without_pipeline_is_one_usage_line(mpirun, dataset):
    proc = mpirun(2, ["-m", "psgd", "train", "--data", dataset, "--microbatches", 4], timeout=60,
                  check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "psgd train: error: --microbatches applies to pipeline runs; give --pipeline K (see --help)"]


@pytest.mark.slow
def test_each_stage_rank_holds_its_share_of_a_model_not_the_whole(mpirun, dataset, tmp_path):
    big = "mlp:784-1500-1500-1500-1500-10"   # 7.9M parameters: 127 MB with gradient, sum, momentum
    n = 784 * 1500 + 3 * 1500 * 1500 + 1500 * 10 + 4 * 1500 + 10
    rss = {}
    for k, cut in ((1, "5"), (4, "2,1,1,1")):
        log = tmp_path / f"k{k}.jsonl"
        mpirun(k, ["-m", "psgd", "train", "--quiet", "--data", dataset, "--model", big,
                   "--batch-size", 16, "--lr", 0.01, "--optimizer", "momentum", "--steps", 2,
                   "--eval-samples", 32, "--pipeline", k, "--partition", cut, "--log", log],
               timeout=300)
        summary = next(json.loads(l) for l in log.read_text().splitlines() if '"summary"' in l)
        rss[k] = summary["pipeline"]["peak_rss_bytes"]
        assert sum(summary["pipeline"]["param_bytes"]) == 4 * n
    whole = 4 * 4 * n                            # bytes of the four vectors of the whole model
    largest = 4 * 4 * (784 * 1500 + 1500 * 1500 + 3000)   # stage 0's four vectors
    # every stage rank saves at least the bytes it does not own, less some slack
    assert max(rss[4]) < rss[1][0] - 0.7 * (whole - largest), (rss, whole, largest)


def test_each_stage_writes_its_part_and_a_cut_off_set_is_skipped_on_resume(
        mpirun, dataset, tmp_path):
    """1f1b, 2 replicas x 2 stages under allreduce, checkpoints every 2 of 8 steps: each stage's
    part holds only its slice; with the step-8 set cut off before its manifest and the step-6
    set missing a part, --resume auto goes on from step 4 and ends bit-equal to the unbroken
    run."""
    a, c, log = tmp_path / "a", tmp_path / "c", tmp_path / "c.jsonl"
    # a fixed cut: the auto cut follows profiled times, which a loaded machine moves
    flags = ["--steps", 8, "--schedule", "1f1b", "--checkpoint-every", 2, "--partition", "1,3"]
    mpirun(4, train(dataset, *flags, "--checkpoint-dir", a), timeout=120)
    one = load_checkpoint(a / "ckpt-00000008.h5")
    stage0 = load_checkpoint(a / "ckpt-00000008.h5", (0, 784 * 32 + 32))   # its first layer
    with h5py.File(a / part_name(8, 0)) as f:   # stage 0's part: its slice only
        assert np.array_equal(f["params"][:], stage0.params)
    shutil.copytree(a, c)
    (c / "ckpt-00000008.h5").unlink()
    (c / part_name(6, 1)).unlink()
    mpirun(4, train(dataset, *flags, "--checkpoint-dir", c, "--resume", "auto", "--log", log,
                    "--log-every", 1), timeout=120)
    steps = [json.loads(l)["step"] for l in log.read_text().splitlines() if '"step"' in l]
    assert steps[0] == 5
    two = load_checkpoint(c / "ckpt-00000008.h5")
    assert np.array_equal(one.params, two.params)
    assert np.array_equal(one.opt_state["velocity"], two.opt_state["velocity"])


@pytest.mark.parametrize("cap,recompute", [("3M", "off"), ("2M", "on")])
def test_recompute_auto_recomputes_only_where_kept_activations_do_not_fit_the_cap(
        mpirun, dataset, cap, recompute):
    """gpipe, M = 4 microbatches of 64 rows: a cut keeping every layer's activations of the 4
    stored microbatches fits 3 MiB per rank, not 2 MiB (where recomputing them fits)."""
    proc = mpirun(2, ["-m", "psgd", "train", "--data", dataset, "--model", "mlp:784-128-128-128-10",
                      "--batch-size", 256, "--pipeline", 2, "--microbatches", 4, "--schedule",
                      "gpipe", "--steps", 1, "--memory-per-rank", cap], timeout=60)
    assert f"--recompute {recompute}" in proc.stdout, proc.stdout
