"""One order, two runners: `psgd train --replay` of `psgd simulate`'s order ends on the
parameters the simulator trained to, bit for bit (coded pushes too: each virtual worker's
encoder and residual, the servers' decoder)."""
import h5py
import numpy as np
import pytest

from psgd.run.checkpoint import list_checkpoints, load_checkpoint

COMMON = ["--model", "mlp:784-32-10", "--batch-size", 16, "--optimizer", "momentum",
          "--lr", 0.05, "--steps", 20, "--quiet"]


@pytest.mark.parametrize("flags", [
    pytest.param(["--protocol", "asp", "--servers", 2, "--staleness-comp", "dcasgd"],
                 marks=pytest.mark.e2e),
    ["--protocol", "bsp", "--servers", 1],
    ["--protocol", "ssp", "--staleness", 1, "--servers", 2],
    ["--protocol", "asp", "--servers", 2, "--compress", "topk:0.1",
     "--momentum-correction", "off"],
    pytest.param(["--protocol", "bsp", "--servers", 2, "--compress", "qsgd:4"],
                 marks=pytest.mark.slow),
], ids=["asp-dcasgd-2-shards", "bsp", "ssp-1", "asp-topk-feedback", "bsp-qsgd"])
def test_a_replay_of_the_simulated_order_trains_to_the_simulators_parameters(
        mpirun, dataset, tmp_path, flags):
    W, rec = 3, tmp_path / "sim.rec.h5"
    sim = mpirun(1, ["-m", "psgd", "simulate", "--data", dataset, *COMMON, *flags, "--workers", W,
                     "--compute-ms", 2, "--jitter", "pareto:1.5", "--train", "--record", rec,
                     "--checkpoint-dir", tmp_path / "sim"], timeout=240).stdout
    assert "trained along it" in sim
    S = int(flags[flags.index("--servers") + 1])
    mpirun(S + W, ["-m", "psgd", "train", "--data", dataset, *COMMON, *flags, "--replay", rec,
                   "--checkpoint-dir", tmp_path / "rep"], timeout=240)
    a = load_checkpoint(list_checkpoints(tmp_path / "sim")[-1]).params
    b = load_checkpoint(list_checkpoints(tmp_path / "rep")[-1]).params
    np.testing.assert_array_equal(a, b)
    with h5py.File(rec) as f:   # asynchrony to replay: not every push read the newest version
        assert f.attrs["n_workers"] == W and f.attrs["n_servers"] == S
