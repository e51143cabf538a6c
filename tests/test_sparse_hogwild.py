"""Sparse hogwild: only touched rows are accumulated and read, no update lost, lazy decay equal to eager."""
import pytest

SCRIPT = "sparse_hogwild_check.py"


@pytest.mark.parametrize("servers, workers", [(1, 1), (1, 2), (2, 3)])
def test_sparse_hogwild_loses_no_update(mpirun, servers, workers):
    out = mpirun(servers + workers, [SCRIPT, servers, 30, 101, 3], timeout=60).stdout
    assert f"sparse hogwild ok: S={servers} W={workers}" in out


@pytest.mark.parametrize("window, servers, workers", [("shared", 2, 1), ("allocate", 2, 1),
                                                      ("allocate", 1, 2)])
def test_sparse_hogwild_reads_only_its_rows_as_the_servers_hold_them(mpirun, window, servers, workers):
    # two shards of 101 rows of 3 cut mid-row; the check asserts bytes read per step and,
    # with one worker, that the rows read equal the servers' values
    out = mpirun(servers + workers, [SCRIPT, servers, 30, 101, 3], timeout=60,
                 env={"PSGD_HOGWILD_WINDOW": window}).stdout
    assert f"sparse hogwild ok: S={servers} W={workers}" in out


def test_sparse_hogwild_lazy_decay_equals_eager(mpirun):
    out = mpirun(3, [SCRIPT, 2, 40, 50, 4, "--decay", "0.1"], timeout=60).stdout
    assert "sparse hogwild ok: S=2 W=1 decay=0.1" in out


@pytest.mark.parametrize("optimizer, servers, workers, extra", [
    ("momentum", 1, 2, []), ("nesterov", 2, 1, ["--decay", "0.05"]),
    ("momentum", 2, 1, ["--decay", "0.05", "--schedule", "cosine"])])
def test_sparse_hogwild_lazy_momentum_equals_eager_and_loses_no_update(mpirun, optimizer, servers,
                                                                       workers, extra):
    # 300 steps: the momentum's products restart twice on the way; the servers' final vector
    # must be each worker's eager momentum trajectory (numpy), summed
    out = mpirun(servers + workers, [SCRIPT, servers, 300, 50, 3, "--optimizer", optimizer, *extra],
                 timeout=90).stdout
    assert f"sparse hogwild ok: S={servers} W={workers}" in out and optimizer in out


@pytest.fixture(scope="module")
def sparse_data(tmp_path_factory):
    from psgd.data.synth_sparse import write_sparse_synthetic
    return str(write_sparse_synthetic(tmp_path_factory.mktemp("sparse") / "s.h5", 4000, 500,
                                      n_features=3000, nnz_per_row=60))


@pytest.mark.parametrize("model, protocol, extra", [
    ("linear", "hogwild", []), ("svm", "hogwild", ["--weight-decay", "1e-4"]),
    ("linear", "asp", ["--compress", "sparse"])])
def test_linear_models_learn_sparse_data_and_move_fewer_bytes(mpirun, sparse_data, tmp_path, model,
                                                              protocol, extra):
    from psgd.run.metrics import read_log
    log = tmp_path / "run.jsonl"
    mpirun(3, ["-m", "psgd", "train", "--data", sparse_data, "--model", model, "--quiet",
               "--protocol", protocol, "--servers", 1, "--lr", 4 if model == "linear" else 0.5,
               "--batch-size", 8, "--epochs", 3, "--log", log, *extra], timeout=180)
    records = read_log(log)
    summary = next(r for r in records if r["kind"] == "summary")
    assert summary["test_accuracy"] > 0.6, summary["test_accuracy"]   # chance: 0.1
    pushed = [r["push_bytes_per_step"] for r in records if r.get("push_bytes_per_step")]
    dense = 4 * 3001 * 10
    assert pushed and max(pushed) < dense / 3, (max(pushed), dense)
    if protocol == "hogwild":   # each step reads its batch's rows only
        pulled = [r["pull_bytes_per_step"] for r in records if r.get("pull_bytes_per_step")]
        assert pulled and max(pulled) < dense / 3, (max(pulled), dense)


def test_sparse_hogwild_checkpoint_mid_run_holds_the_servers_parameters(mpirun, sparse_data, tmp_path):
    # one worker is deterministic: its checkpoint after 60 of 120 steps must equal the final
    # parameters of a 60-step run, though its own copy reads only its batches' rows
    import h5py
    import numpy as np
    common = ["-m", "psgd", "train", "--data", sparse_data, "--model", "linear", "--quiet",
              "--protocol", "hogwild", "--servers", 1, "--lr", 4, "--batch-size", 8]
    mpirun(2, [*common, "--steps", 120, "--checkpoint-dir", tmp_path / "a", "--checkpoint-every", 60],
           timeout=120)
    mpirun(2, [*common, "--steps", 60, "--checkpoint-dir", tmp_path / "b"], timeout=120)
    with h5py.File(tmp_path / "a" / "ckpt-00000060.h5") as a, \
            h5py.File(tmp_path / "b" / "ckpt-00000060.h5") as b:
        assert np.array_equal(a["params"][()], b["params"][()])


@pytest.mark.parametrize("model, extra", [("linear", ["--weight-decay", "1e-3", "--eval-every", 70]),
                                          ("svm", ["--lr-schedule", "cosine"])])
def test_runs_of_fused_steps_equal_the_step_by_step_path_bit_for_bit(mpirun, sparse_data, tmp_path,
                                                                     model, extra):
    # one worker on a shared window is deterministic: the runs of steps in one compiled call
    # (psgd/hogwild/fused.py) must log the same losses, bytes and evaluations and leave the
    # same parameters, mid-run and at the end, as the step-by-step path
    import h5py
    import numpy as np
    from psgd.run.metrics import read_log
    logs = {}
    for fused in ("on", "off"):
        out = tmp_path / fused
        mpirun(2, ["-m", "psgd", "train", "--data", sparse_data, "--model", model, "--quiet",
                   "--protocol", "hogwild", "--servers", 1, "--lr", 2 if model == "linear" else 0.5,
                   "--batch-size", 8, "--steps", 300, "--log-every", 25, "--log", out / "run.jsonl",
                   "--checkpoint-dir", out, "--checkpoint-every", 100, *extra], timeout=120,
               env={"PSGD_HOGWILD_FUSED": fused})
        logs[fused] = [{k: v for k, v in r.items() if k not in ("samples_per_s", "wall_s", "time")
                        and not k.endswith("_s") and k != "est_global_samples_per_s"}
                       for r in read_log(out / "run.jsonl") if r["kind"] in ("step", "eval")]
    assert logs["on"] == logs["off"]
    assert len([r for r in logs["on"] if r["kind"] == "eval"]) == (5 if "--eval-every" in extra else 1)
    for step in (100, 200, 300):
        name = f"ckpt-{step:08d}.h5"
        with h5py.File(tmp_path / "on" / name) as a, h5py.File(tmp_path / "off" / name) as b:
            assert np.array_equal(a["params"][()], b["params"][()]), name


def test_fused_runs_count_every_update_of_every_worker(mpirun, sparse_data, tmp_path):
    from psgd.run.metrics import read_log
    log = tmp_path / "run.jsonl"
    mpirun(4, ["-m", "psgd", "train", "--data", sparse_data, "--model", "linear", "--quiet",
               "--protocol", "hogwild", "--servers", 1, "--lr", 2, "--batch-size", 8,
               "--steps", 200, "--log", log], timeout=120)
    summary = next(r for r in read_log(log) if r["kind"] == "summary")
    assert sum(summary["staleness_histogram"]) == 3 * 200
    assert summary["test_accuracy"] > 0.3, summary["test_accuracy"]


def test_a_hogwild_server_never_loads_numba(mpirun, sparse_data, tmp_path):
    # the server only hosts its shard: numba (about 0.2 s of CPU to import) is the workers'
    out = mpirun(3, ["server_imports_check.py", "train", "--data", sparse_data, "--model", "linear",
                     "--quiet", "--protocol", "hogwild", "--servers", 1, "--steps", 20,
                     "--log", tmp_path / "run.jsonl"], timeout=120).stdout
    assert "rank 0 server: numba not loaded" in out, out
    assert "rank 1 worker: numba loaded" in out and "rank 2 worker: numba loaded" in out, out


def test_lazy_momentum_training_equals_dense_hogwild_and_pushes_by_nonzeros(mpirun, sparse_data,
                                                                             tmp_path):
    # one worker: the lazy Nesterov steps (weight decay, cosine schedule, amom) must leave the
    # parameters and velocity of dense hogwild's eager steps, mid-run and at the end, to float
    # tolerance, while each step pushes by the batch's nonzeros (the data: 60 per row)
    import h5py
    import numpy as np
    from psgd.run.metrics import read_log
    pushed = {}
    for sparse in ("on", "off"):
        out = tmp_path / sparse
        mpirun(2, ["-m", "psgd", "train", "--data", sparse_data, "--model", "linear", "--quiet",
                   "--protocol", "hogwild", "--servers", 1, "--optimizer", "nesterov", "--lr", 0.5,
                   "--weight-decay", 1e-4, "--lr-schedule", "cosine", "--staleness-comp", "amom",
                   "--batch-size", 8, "--steps", 300, "--log", out / "run.jsonl",
                   "--checkpoint-dir", out, "--checkpoint-every", 150], timeout=120,
               env={"PSGD_HOGWILD_SPARSE": sparse})
        pushed[sparse] = [r["push_bytes_per_step"] for r in read_log(out / "run.jsonl")
                          if r["kind"] == "step" and r.get("push_bytes_per_step")]
    for step in (150, 300):
        name = f"ckpt-{step:08d}.h5"
        with h5py.File(tmp_path / "on" / name) as a, h5py.File(tmp_path / "off" / name) as b:
            for key in ("params", "optimizer/velocity"):
                np.testing.assert_allclose(a[key][()], b[key][()], rtol=1e-5, atol=2e-5, err_msg=key)
    n, k = 3001 * 10, 10
    rows_bound = (8 * 60 + 1) * k * 8 + n * 8 / 100   # the batch's rows, and the restarts' share
    assert pushed["off"] and min(pushed["off"]) == n * 4
    assert pushed["on"] and max(pushed["on"]) < rows_bound, (max(pushed["on"]), rows_bound)
