"""Checkpoints: round trip, atomic replacement, clear errors on corrupt files."""
import os

import h5py
import numpy as np
import pytest

from psgd.run.checkpoint import (Checkpoint, list_checkpoints, load_checkpoint, resume_path,
                                 save_checkpoint)


def make(step=10, n=100):
    rng = np.random.default_rng(step)
    return Checkpoint(params=rng.standard_normal(n).astype(np.float32), model_spec="mlp:10-10",
                      step=step, optimizer="adam",
                      opt_state={"m": np.ones(n, np.float32), "v": np.full(n, 2, np.float32),
                                 "steps": 7},
                      clocks=np.array([10, 9]), protocol="ssp", seed=3, config={"lr": 0.1})


def test_round_trip(tmp_path):
    ck = make()
    path = save_checkpoint(tmp_path, ck)
    back = load_checkpoint(path)
    np.testing.assert_array_equal(back.params, ck.params)
    np.testing.assert_array_equal(back.opt_state["m"], ck.opt_state["m"])
    assert back.opt_state["steps"] == 7
    assert (back.step, back.model_spec, back.optimizer, back.seed) == (10, "mlp:10-10", "adam", 3)
    assert back.config == {"lr": 0.1}
    assert back.clocks.tolist() == [10, 9]


def test_keeps_newest_and_resolves_directory(tmp_path):
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, make(step), keep=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["ckpt-00000015.h5", "ckpt-00000020.h5"]
    assert resume_path(str(tmp_path), None).name == "ckpt-00000020.h5"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_failed_write_leaves_previous_checkpoint_and_no_temp(tmp_path):
    save_checkpoint(tmp_path, make(5))
    bad = make(10)
    bad.opt_state = {"m": object()}  # cannot be converted: the write fails midway
    with pytest.raises(TypeError):
        save_checkpoint(tmp_path, bad)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000005.h5"]
    assert os.listdir(tmp_path) == ["ckpt-00000005.h5"]
    load_checkpoint(tmp_path / "ckpt-00000005.h5")


@pytest.mark.parametrize("corrupt, match", [
    (lambda p: open(p, "wb").write(b"garbage"), "not a readable HDF5"),
    (lambda p: h5py.File(p, "a").__delitem__("params"), "missing dataset /params"),
    (lambda p: h5py.File(p, "a").attrs.__delitem__("model_spec"), "missing attribute 'model_spec'"),
    (lambda p: h5py.File(p, "a").attrs.__setitem__("n_params", 5), "n_params"),
    (lambda p: h5py.File(p, "a").attrs.__setitem__("format_version", 99), "format version"),
])
def test_corrupt_checkpoint_gives_clear_error(tmp_path, corrupt, match):
    path = save_checkpoint(tmp_path, make())
    corrupt(path)
    with pytest.raises(ValueError, match=match):
        load_checkpoint(path)


def test_nan_params_rejected(tmp_path):
    ck = make()
    ck.params[3] = np.nan
    path = save_checkpoint(tmp_path, ck)
    with pytest.raises(ValueError, match="non-finite"):
        load_checkpoint(path)


def test_resume_missing(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        resume_path(str(tmp_path / "nope.h5"), None)
    with pytest.raises(ValueError, match="no checkpoint"):
        resume_path(str(tmp_path), None)
