"""`psgd train --tensor/--spatial/--grid` end to end: the same run as serial or data-parallel
training, and the bad input it refuses in one line."""
import numpy as np
import pytest

from psgd.run.metrics import read_log
from conftest import serial_float64


def train(mpirun, n, data, log, *flags, check=True, timeout=240):
    return mpirun(n, ["-m", "psgd", "train", "--data", data, "--quiet", "--protocol", "allreduce",
                      "--log", str(log), *map(str, flags)], timeout=timeout, check=check)


def summary(log):
    return [r for r in read_log(log) if r["kind"] == "summary"][-1]


@pytest.mark.e2e
@pytest.mark.mpi
def test_grid_2x2_trains_as_data_parallel_on_2_ranks_and_halves_parameters(mpirun, dataset, tmp_path):
    """D=2 x T=2 (Megatron pair, uneven 45-wide layer, momentum) against plain all-reduce on
    2 ranks: the same batches, so the same test loss to float32 round-off."""
    flags = ["--model", "mlp:784-45-33-10", "--optimizer", "momentum", "--lr", "0.05",
             "--batch-size", 16, "--steps", 30]
    train(mpirun, 4, dataset, tmp_path / "grid.jsonl", *flags, "--grid", "2,2")
    train(mpirun, 2, dataset, tmp_path / "dp.jsonl", *flags)
    grid, dp = summary(tmp_path / "grid.jsonl"), summary(tmp_path / "dp.jsonl")
    assert grid["test_loss"] == pytest.approx(dp["test_loss"], rel=1e-4)
    assert grid["param_bytes_serial"] == (784 * 45 + 45 + 45 * 33 + 33 + 33 * 10 + 10) * 4
    # the largest part (rank 0's): 23 of layer 1's 45 columns, 23 of layer 2's rows and its
    # whole bias, and 5 of the last layer's 10 columns (it gathers)
    assert grid["param_bytes_per_rank"] == (784 * 23 + 23 + 23 * 33 + 33 + 33 * 5 + 5) * 4
    # memory per rank: the gradient is the part's size; the first layer's input (16 x 784
    # float32) is among the buffers each rank holds for its backward
    assert grid["grad_bytes"] == grid["param_bytes"] and max(grid["param_bytes"]) == grid["param_bytes_per_rank"]
    assert all(b >= 16 * 784 * 4 for b in grid["activation_bytes"]), grid["activation_bytes"]
    # time per layer: the Megatron pair's one all-reduce is the row layer's (the first
    # layer's backward all-reduce of its input gradient is skipped: no layer needs it), and
    # the last layer, left without a partner, waits on its all-gather
    rows = {row["layer"]: row for row in grid["layer_ms"]}
    assert list(rows) == ["0 ColumnDense", "1 RowDense", "2 ColumnDense", "after the layers"], list(rows)
    assert rows["0 ColumnDense"]["collective_ms"] == {}, rows["0 ColumnDense"]
    assert list(rows["1 RowDense"]["collective_ms"]) == ["all-reduce"], rows["1 RowDense"]
    assert rows["2 ColumnDense"]["collective_ms"].get("all-gather", 0) > 0, rows["2 ColumnDense"]
    assert all(row["compute_ms"] > 0 for name, row in rows.items() if "Dense" in name)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, grid", [(2, "1,auto"), (4, "2,auto")])
def test_grid_auto_mixes_batch_and_tensor_layers_and_trains_as_serial(mpirun, dataset, tmp_path, ranks, grid):
    """--grid 1,auto on 2 ranks (D = 1), and 2,auto on 4 (D = 2 groups of 2, combined by
    all-reduce): the conv trunk (its dropout drawing the serial masks) on each rank's
    samples, the wide dense head split (the cut is neither end), and the run is the serial
    run (D = 2: plain all-reduce on 2 ranks) on the same batches (float32)."""
    flags = ["--model", "conv:8x3:pad1-relu-dropout:0.25-conv:8x3:pad1-relu-pool:2-flatten-dense:256-relu-dense:10",
             "--optimizer", "momentum", "--lr", "0.05", "--batch-size", 16, "--steps", 15]
    d = ranks // 2
    train(mpirun, ranks, dataset, tmp_path / "auto.jsonl", *flags, "--grid", grid)
    train(mpirun, d, dataset, tmp_path / "serial.jsonl", *flags)
    auto, serial = summary(tmp_path / "auto.jsonl"), summary(tmp_path / "serial.jsonl")
    assert auto["axis"] == "auto" and auto["grid"] == [d, 2] and 3 < auto["auto_cut"] < 10
    assert auto["auto_network"] == "10 Gbit/s, 20 us per message, 1 rank(s) per node"
    assert auto["test_loss"] == pytest.approx(serial["test_loss"], rel=1e-4)


@pytest.mark.mpi
@pytest.mark.parametrize("model, network, grid", [
    ("mlp:784-1024-1024-10", ["--bandwidth", "0.1gbit"], [1, 2]),
    ("conv:8x3:pad1-relu-conv:8x3:pad1-relu-pool:2-flatten-dense:32-relu-dense:10", [], [2, 1])])
def test_plain_grid_auto_chooses_d_and_t_and_trains_as_serial(mpirun, dataset, tmp_path, model, network, grid):
    """Plain --grid auto on 2 ranks picks the grid itself: the weight-heavy MLP on a slow link
    splits over both ranks (D = 1: the serial run), the conv net runs pure data-parallel
    (D = 2: plain all-reduce on 2 ranks, no --grid); the same test loss (float64 for D = 1) and the
    modelled grids in the summary, the chosen one cheapest."""
    d = grid[0]
    flags = ["--model", model, "--optimizer", "momentum", "--lr", "0.05", "--batch-size", 16,
             "--steps", 8, "--dtype", "float64" if d == 1 else "float32"]
    train(mpirun, 2, dataset, tmp_path / "auto.jsonl", *flags, *network, "--grid", "auto")
    train(mpirun, d, dataset, tmp_path / "ref.jsonl", *flags, *(["--grid", "1,1"] if d == 1 else []))
    auto, ref = summary(tmp_path / "auto.jsonl"), summary(tmp_path / "ref.jsonl")
    assert auto["grid"] == grid and set(auto["auto_grids"]) == {"1x2", "2x1"}
    assert auto["auto_grids"][f"{d}x{3 - d}"] == min(auto["auto_grids"].values())
    assert auto["test_loss"] == pytest.approx(ref["test_loss"], rel=1e-9 if d == 1 else 1e-4)


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("flags", [["--model", "mlp:784-64-64-10", "--tensor", 2],
                                   ["--model", "lenet", "--tensor", 2],
                                   ["--model", "resnet8", "--tensor", 2],
                                   ["--model", "resnet8", "--spatial", 2],
                                   ["--model", "conv:8x3:pad1-bn-relu-pool:2-conv:8x3:pad1-relu-pool:2-"
                                               "flatten-dense:10", "--spatial", 2]])
def test_500_steps_split_over_2_ranks_end_within_1_percent_of_serial(mpirun, dataset, tmp_path, flags):
    """Plain SGD at a modest rate: with momentum 0.9 at lr 0.02 this small data set is
    overfitted, and float32 round-off alone (--spatial 1 against serial) moves the test
    loss by more than half, so the comparison would measure chaos, not the split."""
    common = ["--optimizer", "sgd", "--lr", "0.01", "--batch-size", 32, "--steps", 500,
              "--log-every", 100, "--model", flags[1]]
    train(mpirun, 2, dataset, tmp_path / "split.jsonl", *common, *flags[2:], timeout=600)
    train(mpirun, 1, dataset, tmp_path / "serial.jsonl", *common, timeout=600)
    split, serial = summary(tmp_path / "split.jsonl"), summary(tmp_path / "serial.jsonl")
    assert split["test_loss"] == pytest.approx(serial["test_loss"], rel=0.01)
    last = [[r for r in read_log(tmp_path / f) if r["kind"] == "step"][-1]["loss"]
            for f in ("split.jsonl", "serial.jsonl")]
    assert last[0] == pytest.approx(last[1], rel=0.01)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, flags, line", [
    (3, ["--model", "mlp:784-8-10", "--grid", "2,2"], "--grid 2,2 needs 4 ranks, the job has 3"),
    (2, ["--model", "mlp:784-8-10", "--tensor", 2, "--tensorboard", "tb"],
     "--tensorboard is not supported with --tensor"),
    (2, ["--model", "mlp:784-8-10", "--tensor", 2, "--compress", "topk:0.1"],
     "--compress is not supported with --tensor"),
    (2, ["--model", "mlp:784-8-10", "--spatial", 2], "--spatial needs a model with conv layers"),
    (2, ["--model", "mlp:784-8-10", "--grid", "auto", "--tensor", 2], "--grid auto chooses each layer's split"),
    (2, ["--model", "mlp:784-8-10", "--grid", "3,auto"], "--grid 3,auto: D must be >= 1 and divide the job's 2"),
    (2, ["--model", "mlp:784-8-10", "--grid", "auto", "--bandwidth", "fast"], "--bandwidth 'fast' is not a bandwidth"),
    (2, ["--model", "mlp:784-1-10", "--tensor", 2], "--tensor 2 is larger than dense layer 784->1"),
    (1, ["--model", "mlp:784-8-10", "--dtype", "float64"], "--dtype float64 runs only with --tensor"),
    (2, ["--model", "mlp:784-8-10", "--tensor", 2, "--dtype", "float16"], "--dtype float16: choose one of"),
])
def test_bad_tensor_input_gives_one_clear_line(mpirun, dataset, tmp_path, ranks, flags, line):
    out = train(mpirun, ranks, dataset, tmp_path / "x.jsonl", "--steps", 2, *flags, check=False)
    errors = [x for x in out.stderr.splitlines() if x.startswith("psgd: error")]
    assert out.returncode != 0 and len(errors) == 1 and line in errors[0], out.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, flags, line", [
    (3, ["--tensor", 2, "--protocol", "ssp", "--servers", 1], "--servers 1: each of the 2 model parts"),
    (4, ["--tensor", 2, "--protocol", "hogwild", "--servers", 2], "not hogwild"),
    (4, ["--tensor", 2, "--protocol", "bsp", "--servers", 2, "--dtype", "float64"],
     "the parameter servers hold float32"),
])
def test_a_ps_protocol_the_grid_cannot_run_is_refused(mpirun, dataset, ranks, flags, line):
    out = mpirun(ranks, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--model", "mlp:784-8-10",
                         "--steps", 2, *map(str, flags)], check=False)
    errors = [x for x in out.stderr.splitlines() if x.startswith("psgd: error")]
    assert out.returncode != 0 and len(errors) == 1 and line in errors[0], out.stderr


def _train_and_assert_serial(mpirun, ranks, dataset, log, model, flags, run, rtol):
    """Train ``model`` split by ``flags`` with momentum SGD (``run``: steps, batch, lr,
    momentum); every step's loss and the test loss in ``log`` are serial float64 momentum
    SGD's on the same batches to ``rtol``, and the steps moved the model."""
    steps, batch, lr, mu = run
    train(mpirun, ranks, dataset, log, "--model", model, *flags, "--optimizer", "momentum",
          "--momentum", mu, "--lr", lr, "--lr-schedule", "constant", "--batch-size", batch,
          "--steps", steps, "--log-every", 1)
    replicas = 2 if "--grid" in flags else 1
    losses, test_loss = serial_float64(dataset, model, replicas, steps, batch, lr, mu)
    logged = [r["loss"] for r in read_log(log) if r["kind"] == "step"]
    np.testing.assert_allclose(logged, losses.mean(axis=1), rtol=rtol)
    assert summary(log)["test_loss"] == pytest.approx(test_loss, rel=rtol)
    untrained = serial_float64(dataset, model, replicas, 0, batch, lr, mu)[1]
    assert abs(test_loss - untrained) > 1e-3   # the steps moved the model


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, model, flags", [
    (6, "mlp:784-45-33-10", ["--grid", "2,2", "--servers", 2]),
    (6, "mlp:784-45-33-10", ["--tensor", 2, "--servers", 4]),
    # --grid 2,auto: the conv and its dropout on each rank's samples, the dense layers split
    (6, "conv:4x3:pad1-relu-dropout:0.25-pool:2-flatten-dense:64-relu-dense:10",
     ["--grid", "2,auto", "--servers", 2])])
def test_bsp_servers_across_the_replicas_equal_serial_sgd_on_the_same_batches(mpirun, dataset, tmp_path,
                                                                              ranks, model, flags):
    """Each part's D replicas push to its own S/T servers; bsp averages and steps once per
    clock, so every step's loss and the test loss are serial momentum SGD's (float32 round-off)."""
    _train_and_assert_serial(mpirun, ranks, dataset, tmp_path / "run.jsonl", model,
                             [*flags, "--protocol", "bsp"], (10, 16, 0.0625, 0.875), rtol=1e-5)


@pytest.mark.mpi
@pytest.mark.parametrize("protocol, model, grid", [
    ("asp", "mlp:784-45-33-10", "2,2"), ("ssp", "mlp:784-45-33-10", "2,2"),
    # --grid 2,auto: the conv on samples (copies on both parts, part 0's shared each step)
    ("asp", "conv:4x3:pad1-relu-pool:2-flatten-dense:64-relu-dense:10", "2,auto")])
def test_asynchronous_servers_across_the_replicas_train_the_grid(mpirun, dataset, tmp_path, protocol, model, grid):
    train(mpirun, 6, dataset, tmp_path / "run.jsonl", "--model", model, "--grid", grid,
          "--servers", 2, "--protocol", protocol, "--optimizer", "momentum", "--lr", 0.05,
          "--batch-size", 32, "--steps", 60)
    untrained = serial_float64(dataset, model, 1, 0, 32, 0.05, 0.9)[1]
    assert summary(tmp_path / "run.jsonl")["test_loss"] < untrained - 0.3


@pytest.mark.mpi
def test_sigterm_to_one_rank_stops_every_rank_of_the_grid_at_one_step(dataset, tmp_path):
    import os
    import signal

    from psgd.run.signals import EXIT_STOPPED
    from test_stop import _finish, _rank_pid, _start, _wait_for_training
    marker, log = f"tensor-stop-{os.getpid()}", tmp_path / "log.jsonl"
    proc = _start(4, ["--data", dataset, "--model", "mlp:784-32-10", "--protocol", "allreduce",
                      "--grid", "2,2", "--steps", 5000, "--batch-size", 16, "--log-every", 5,
                      "--quiet", "--log", log], marker)
    _wait_for_training(log, proc)
    os.kill(_rank_pid(marker, 3), signal.SIGTERM)
    out, err = _finish(proc)
    assert proc.returncode == EXIT_STOPPED, (out, err)
    assert "stopped by SIGTERM" in out and "Traceback" not in err, (out, err)
    assert 0 < summary(log)["steps"] < 5000


def _ckpt(directory, step):
    from psgd.run.checkpoint import load_checkpoint
    return load_checkpoint(directory / f"ckpt-{step:08d}.h5")


@pytest.mark.mpi
def test_grid_run_resumed_from_its_checkpoint_ends_bit_equal_to_the_unbroken_run(mpirun, dataset, tmp_path):
    """--grid 2,2 saves the serial flat vector (parts gathered) and takes its part back on load."""
    from conftest import assert_resumed_alike
    full, part = tmp_path / "full", tmp_path / "part"
    common = ["--model", "mlp:784-45-33-10", "--optimizer", "momentum", "--lr", "0.05",
              "--batch-size", 16, "--steps", 20, "--checkpoint-every", 10, "--grid", "2,2"]
    train(mpirun, 4, dataset, tmp_path / "full.jsonl", *common, "--checkpoint-dir", full)
    part.mkdir()
    (part / "ckpt-00000010.h5").write_bytes((full / "ckpt-00000010.h5").read_bytes())
    train(mpirun, 4, dataset, tmp_path / "part.jsonl", *common, "--checkpoint-dir", part, "--resume", part)
    assert_resumed_alike(tmp_path, full, part)


@pytest.mark.mpi
def test_grid_over_bsp_servers_resumed_from_its_checkpoint_ends_bit_equal_and_as_allreduce(
        mpirun, dataset, tmp_path):
    """--grid 2,2 over 2 bsp servers (one per part): each part's lead server hands replica 0 its
    snapshot, saved as the serial flat vector; a run resumed at step 10 (the servers given the
    part's parameters, momentum and clock) ends bit-equal, and the state equals the
    all-reduce run's on the same batches (float32 round-off)."""
    from conftest import assert_resumed_alike
    full, part = tmp_path / "full", tmp_path / "part"
    common = ["--model", "mlp:784-45-33-10", "--optimizer", "momentum", "--lr", "0.05",
              "--batch-size", 16, "--steps", 20, "--checkpoint-every", 10]
    servers = ["--grid", "2,2", "--protocol", "bsp", "--servers", 2]
    train(mpirun, 6, dataset, tmp_path / "full.jsonl", *common, *servers, "--checkpoint-dir", full)
    part.mkdir()
    (part / "ckpt-00000010.h5").write_bytes((full / "ckpt-00000010.h5").read_bytes())
    train(mpirun, 6, dataset, tmp_path / "part.jsonl", *common, *servers, "--checkpoint-dir", part,
          "--resume", part)
    assert_resumed_alike(tmp_path, full, part)
    train(mpirun, 2, dataset, tmp_path / "dp.jsonl", *common, "--checkpoint-dir", tmp_path / "dp")
    for step in (10, 20):
        a, b = _ckpt(full, step), _ckpt(tmp_path / "dp", step)
        np.testing.assert_allclose(a.params, b.params, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(a.opt_state["velocity"], b.opt_state["velocity"], rtol=1e-4, atol=1e-6)


@pytest.mark.mpi
@pytest.mark.parametrize("model, split", [
    ("mlp:784-45-33-10", "--tensor"), ("conv:6x3:pad1-bn-relu-pool:2-flatten-dense:10", "--spatial")])
def test_a_checkpoint_passes_between_a_split_run_and_a_plain_run_both_ways(mpirun, dataset, tmp_path,
                                                                          model, split):
    """Split (2 ranks, one replica) 0 -> 20; plain all-reduce (1 rank) resumes its step 10 and
    ends as it does; the split run resumes the plain run's step 15 and ends as both do (the
    same batches and arithmetic, so float32 round-off apart)."""
    common = ["--model", model, "--optimizer", "momentum", "--lr", "0.05", "--batch-size", 16,
              "--steps", 20, "--checkpoint-every", 5]
    dirs = {name: tmp_path / name for name in ("split", "plain", "back")}
    train(mpirun, 2, dataset, tmp_path / "split.jsonl", *common, split, 2, "--checkpoint-dir", dirs["split"])
    dirs["plain"].mkdir()
    (dirs["plain"] / "ckpt-00000010.h5").write_bytes((dirs["split"] / "ckpt-00000010.h5").read_bytes())
    train(mpirun, 1, dataset, tmp_path / "plain.jsonl", *common, "--checkpoint-dir", dirs["plain"],
          "--resume", dirs["plain"])
    dirs["back"].mkdir()
    (dirs["back"] / "ckpt-00000015.h5").write_bytes((dirs["plain"] / "ckpt-00000015.h5").read_bytes())
    train(mpirun, 2, dataset, tmp_path / "back.jsonl", *common, split, 2, "--checkpoint-dir", dirs["back"],
          "--resume", dirs["back"])
    ends = [_ckpt(dirs[name], 20) for name in ("split", "plain", "back")]
    start = _ckpt(dirs["split"], 10).params
    moved = np.abs(ends[0].params - start).max()
    for other in ends[1:]:
        assert np.abs(other.params - ends[0].params).max() < 1e-3 * moved
        np.testing.assert_allclose(other.opt_state["velocity"], ends[0].opt_state["velocity"],
                                   atol=1e-3 * np.abs(ends[0].opt_state["velocity"]).max())


@pytest.mark.mpi
@pytest.mark.parametrize("ranks, model, flags", [
    (4, "mlp:784-45-33-10", ["--grid", "2,2"]),
    (2, "conv:6x3:pad1-bn-relu-pool:2-conv:5x3:s2-relu-flatten-dense:10", ["--spatial", 2]),
    (2, "conv:6x3:pad1-relu-conv:5x3-bn-relu-pool:2-flatten-dense:10", ["--tensor", 2])])
def test_dtype_float64_grid_run_equals_serial_float64_to_1e12(mpirun, dataset, tmp_path, ranks, model, flags):
    """--dtype float64: every step's loss and the final test loss of the split run equal serial
    float64 momentum SGD on the same batches to 1e-12 relative (float32 differs near 1e-6)."""
    _train_and_assert_serial(mpirun, ranks, dataset, tmp_path / "run.jsonl", model,
                             [*flags, "--dtype", "float64"], (8, 16, 0.0625, 0.875), rtol=1e-12)


@pytest.mark.mpi
def test_timeline_shows_each_step_and_the_tensor_collectives_inside_its_compute(mpirun, dataset, tmp_path):
    import json
    train(mpirun, 2, dataset, tmp_path / "run.jsonl", "--model", "mlp:784-45-33-10", "--tensor", 2,
          "--steps", 6, "--timeline", tmp_path / "t.json")
    events = [e for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"] if e.get("ph") == "X"]
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        names = [e["name"] for e in mine]
        assert names.count("data") == names.count("compute") == names.count("step") == 6
        computes = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["name"] == "compute"]
        collectives = [e for e in mine if e["name"] == "collective"]
        # a Megatron pair's all-reduce forward, the unpaired last layer's gather, each step
        assert len(collectives) >= 2 * 6
        assert all(any(a - 1 <= e["ts"] and e["ts"] + e["dur"] <= b + 1 for a, b in computes)
                   for e in collectives)


@pytest.mark.slow
@pytest.mark.mpi
def test_each_tensor_rank_holds_its_share_of_a_wide_model_not_the_whole(mpirun, dataset, tmp_path):
    """--tensor 2 on a 14M-parameter MLP: each rank's peak RSS above a tiny model's run (the
    process base) is about its part's parameters, gradient and velocity, and far below what
    the whole model's parameters and gradient (which every rank used to build) add."""
    peak = {}
    for i, model in enumerate(("mlp:784-16-10", "mlp:784-2048-2048-2048-2048-10")):
        log = tmp_path / f"run{i}.jsonl"
        train(mpirun, 2, dataset, log, "--model", model, "--tensor", 2, "--optimizer", "momentum",
              "--steps", 2, "--batch-size", 16, "--eval-samples", 32, timeout=300)
        peak[model] = summary(log)
    base, big = peak.values()
    share = 3 * big["param_bytes_per_rank"]                 # parameters, gradient, velocity
    excess = max(big["peak_rss_bytes"]) - max(base["peak_rss_bytes"])
    assert excess < share + big["param_bytes_serial"] / 2, (excess, share, big["param_bytes_serial"])


@pytest.mark.mpi
def test_grid_auto_puts_the_convs_on_rows_and_splits_the_dense_head_as_serial(mpirun, tmp_path):
    """5 colour 32x32 images per step on 2 ranks: --grid 1,auto runs the convs on each rank's
    rows of every image (a batch split would leave one rank 3 of 5 samples), gathers them at
    the flatten and splits the dense layers by tensor; float64, the serial run's test loss."""
    import subprocess
    import sys
    data = tmp_path / "colour.h5"
    subprocess.run([sys.executable, "-m", "psgd", "data", "synth", "--channels", "3", "--train", "200",
                    "--test", "64", "-o", str(data)], check=True, capture_output=True)
    flags = ["--model", "conv:16x3:pad1-relu-conv:16x3:pad1-relu-pool:4-flatten-dense:1024-relu-dense:10",
             "--optimizer", "momentum", "--lr", "0.05", "--batch-size", 5, "--steps", 4, "--dtype", "float64"]
    train(mpirun, 2, str(data), tmp_path / "auto.jsonl", *flags, "--grid", "1,auto")
    train(mpirun, 1, str(data), tmp_path / "serial.jsonl", *flags, "--grid", "1,1")
    auto, serial = summary(tmp_path / "auto.jsonl"), summary(tmp_path / "serial.jsonl")
    assert (auto["auto_head"], auto["auto_cut"]) == ("spatial", 6)
    assert auto["test_loss"] == pytest.approx(serial["test_loss"], rel=1e-9)
