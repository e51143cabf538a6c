"""`psgd train` end to end under mpiexec: every protocol trains, logs, checkpoints and resumes."""
import shutil

import numpy as np
import pytest

from psgd.protocols import get
from psgd.run.checkpoint import list_checkpoints, load_checkpoint
from psgd.run.metrics import read_log

MLP = "mlp:784-32-10"


def train(mpirun, n, data, *flags, check=True, timeout=180):
    return mpirun(n, ["-m", "psgd", "train", "--data", data, "--quiet", *map(str, flags)],
                  timeout=timeout, check=check)


def kinds(records):
    return [r["kind"] for r in records]


# make test keeps one of these per protocol family (e2e): asp for the parameter server, whose
# first run is also recorded and replayed bit for bit, hogwild, and allreduce
@pytest.mark.parametrize("protocol, ranks, servers, resume_ranks, resume_servers", [
    ("bsp", 3, 1, 4, 2),
    ("ssp", 3, 1, 4, 1),
    pytest.param("asp", 3, 1, 4, 2, marks=pytest.mark.e2e),
    pytest.param("hogwild", 3, 1, 3, 2, marks=pytest.mark.e2e),
    pytest.param("allreduce", 2, 0, 3, 0, marks=pytest.mark.e2e),
])
def test_protocol_trains_logs_checkpoints_and_resumes_with_other_ranks(
        mpirun, dataset, tmp_path, protocol, ranks, servers, resume_ranks, resume_servers):
    opt = "sgd" if protocol == "hogwild" else "momentum"
    ckdir, log1, log2 = tmp_path / "ck", tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    common = ["--model", MLP, "--protocol", protocol, "--optimizer", opt, "--lr", "0.05",
              "--batch-size", 16, "--checkpoint-every", 6]
    first = [*common, "--servers", servers, "--steps", 12, "--eval-every", 6, "--log-every", 3]
    replays = protocol == "asp"     # bsp and ssp replays: test_record_replay.py
    assert replays <= get(protocol).can("replay")
    record = ["--record", tmp_path / "run.rec.h5"] if replays else []
    out = train(mpirun, ranks, dataset, *first, "--checkpoint-dir", ckdir, "--log", log1,
                *record).stdout
    assert "final test accuracy" in out
    records = read_log(log1)
    assert kinds(records)[0] == "config" and kinds(records)[-1] == "summary"
    steps = [r["step"] for r in records if r["kind"] == "step"]
    assert steps == [3, 6, 9, 12]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [6, 12]
    summary = records[-1]
    assert summary["steps"] == 12 and 0.0 <= summary["test_accuracy"] <= 1.0
    assert summary["samples"] == 12 * 16 * (ranks - servers)
    if protocol in ("bsp", "ssp", "asp", "hogwild"):
        assert sum(summary["staleness_histogram"]) == 12 * (ranks - servers)
    if protocol == "bsp":
        assert summary["staleness_histogram"] == [24]
    names = [p.name for p in list_checkpoints(ckdir)]
    assert names[-1] == "ckpt-00000012.h5" and "ckpt-00000006.h5" in names
    ck = load_checkpoint(ckdir / "ckpt-00000012.h5")
    assert ck.step == 12 and ck.model_spec == MLP and ck.protocol == protocol
    assert np.all(np.isfinite(ck.params))
    dana = {"ssp", "asp"}   # auto's pick for momentum: each worker's velocity is checkpointed
    if protocol in dana:
        assert sorted(k for k in ck.opt_state if k.startswith("dana_")) == \
            [f"dana_velocity_{i}" for i in range(ranks - servers)]
        assert all(np.abs(ck.opt_state[f"dana_velocity_{i}"]).max() > 0 for i in range(2))

    if replays:     # the recorded run again, in the recorded order: the same parameters
        train(mpirun, ranks, dataset, *first, "--checkpoint-dir", tmp_path / "replay",
              "--replay", tmp_path / "run.rec.h5")
        again = load_checkpoint(tmp_path / "replay" / "ckpt-00000012.h5")
        np.testing.assert_array_equal(again.params, ck.params)

    common += ["--checkpoint-dir", ckdir]
    train(mpirun, resume_ranks, dataset, *common, "--servers", resume_servers, "--steps", 18,
          "--resume", ckdir, "--log", log2)
    summary2 = read_log(log2)[-1]
    assert (summary2["start_step"], summary2["steps"]) == (12, 18)
    assert summary2["samples"] == 6 * 16 * (resume_ranks - resume_servers)
    last = load_checkpoint(list_checkpoints(ckdir)[-1])
    assert last.step == 18
    if protocol in dana:
        assert sorted(k for k in last.opt_state if k.startswith("dana_")) == \
            [f"dana_velocity_{i}" for i in range(resume_ranks - resume_servers)]


def test_bsp_interrupted_and_resumed_equals_uninterrupted(mpirun, dataset, tmp_path):
    """BSP resumed from step 10 (even with another server count) ends bitwise where an
    uninterrupted run with the same seed ends."""
    common = ["--model", MLP, "--protocol", "bsp", "--optimizer", "momentum", "--lr", "0.05",
              "--batch-size", 16, "--steps", 20, "--checkpoint-every", 10, "--seed", 3]
    full, part = tmp_path / "full", tmp_path / "part"
    train(mpirun, 3, dataset, *common, "--servers", 1, "--checkpoint-dir", full)
    part.mkdir()
    shutil.copy(full / "ckpt-00000010.h5", part)
    train(mpirun, 4, dataset, *common, "--servers", 2, "--checkpoint-dir", part, "--resume", part)
    a = load_checkpoint(full / "ckpt-00000020.h5")
    b = load_checkpoint(part / "ckpt-00000020.h5")
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.opt_state["velocity"], b.opt_state["velocity"])
    before = load_checkpoint(full / "ckpt-00000010.h5")
    assert not np.array_equal(a.params, before.params)


@pytest.mark.parametrize("flags, message", [
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--protocol", "bsp", "--staleness", "3"], "--staleness applies to --protocol ssp only"),
    (["--servers", "5"], "--servers 5 leaves no worker"),
    (["--bogus-flag"], "unrecognized arguments: --bogus-flag"),
    (["--model", "mlp:784-abc"], "mlp"),
    (["--model", "mlp:100-10"], "inputs of shape"),
    (["--protocol", "hogwild", "--optimizer", "adam"], "adam"),
    (["--straggler", "2:slow=3"], "--straggler names worker 2, but the job has 2 workers"),
    (["--protocol", "asp", "--staleness", "auto"], "--staleness auto applies to --protocol ssp"),
])
def test_bad_input_is_one_line_from_rank_0(mpirun, dataset, flags, message):
    proc = train(mpirun, 3, dataset, *flags, check=False, timeout=90)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert message in lines[0]
    assert "Traceback" not in proc.stderr


def test_missing_data_and_foreign_checkpoint(mpirun, dataset, tmp_path):
    proc = mpirun(2, ["-m", "psgd", "train", "--data", tmp_path / "nope.h5"], check=False, timeout=60)
    assert proc.returncode != 0 and "no such file" in proc.stderr and "Traceback" not in proc.stderr
    ck = tmp_path / "ck"
    train(mpirun, 2, dataset, "--model", MLP, "--steps", 2, "--checkpoint-dir", ck,
          "--protocol", "allreduce", "--batch-size", 16)
    proc = train(mpirun, 2, dataset, "--model", "mlp:784-16-10", "--steps", 4, "--resume", ck,
                 "--protocol", "allreduce", "--batch-size", 16, check=False, timeout=60)
    assert proc.returncode != 0
    assert f"is of model '{MLP}', not --model 'mlp:784-16-10'" in proc.stderr
    assert "Traceback" not in proc.stderr
