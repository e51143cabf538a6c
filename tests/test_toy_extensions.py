"""A new protocol, compressor, compensation method and layer are each one module and one
registration, from outside
psgd's tree (tests/toys, loaded with PSGD_PLUGINS): --help, validation, psgd plan, the job
scripts' check, training and the fault tests pick them up."""
import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from psgd import compress, protocols
from psgd.nn import spec
from psgd.ps import compensation

TOYS = Path(__file__).parent / "toys"
MODULES = ("toy_protocol", "toy_codec", "toy_layer", "toy_comp")
ENV = {"PSGD_PLUGINS": ",".join(MODULES),
       "PYTHONPATH": os.pathsep.join([str(TOYS), os.environ.get("PYTHONPATH", "")])}
MODEL = "flatten-dense:32-softsign-dense:10"


@pytest.fixture
def toys(monkeypatch):
    """The toys registered in this process, the registries restored afterwards."""
    saved = [(d, dict(d)) for d in (protocols.PROTOCOLS, compress.HELP, compress._REGISTERED,
                                    spec.TOKENS, spec._REGISTERED, compensation.METHODS)]
    monkeypatch.setattr(spec, "TOKEN_HELP", spec.TOKEN_HELP)
    monkeypatch.syspath_prepend(str(TOYS))
    for name in MODULES:
        sys.modules.pop(name, None)
        importlib.import_module(name)
    yield
    for d, before in saved:
        d.clear()
        d.update(before)
    for name in MODULES:
        sys.modules.pop(name, None)


def resolve(data, *flags):
    from psgd.run.settings import add_arguments
    from psgd.run.settings import resolve as settings_resolve
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return settings_resolve(parser.parse_args(["--data", str(data), *map(str, flags)]), environ={})


def test_help_lists_the_toys():
    env = {**os.environ, **ENV}
    out = subprocess.run([sys.executable, "-m", "psgd", "train", "--help"], env=env,
                         capture_output=True, text=True, check=True).stdout
    for name in ("toymean", "toy16", "toyhalf"):   # the layer tokens are listed by a bad --model's error
        assert name in out, name


def test_a_plugin_that_does_not_import_is_one_line():
    env = {**os.environ, "PSGD_PLUGINS": "no_such_toy"}
    proc = subprocess.run([sys.executable, "-m", "psgd", "train", "--help"], env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "psgd: error: PSGD_PLUGINS: cannot import 'no_such_toy' (No module named 'no_such_toy'); "
        "put its folder on PYTHONPATH"]


def test_validation_applies_the_toys_entries(toys, tmp_path):
    data = tmp_path / "d.h5"
    data.touch()
    s = resolve(data, "--protocol", "toymean", "--optimizer", "sgd", "--model", MODEL)
    assert (s.protocol, s.servers) == ("toymean", 0)
    with pytest.raises(ValueError, match="toymean has no servers"):
        resolve(data, "--protocol", "toymean", "--servers", "1")
    with pytest.raises(ValueError, match="optimizer 'adam' is not supported with --protocol "
                                         "toymean: a toy"):
        resolve(data, "--protocol", "toymean", "--optimizer", "adam")
    with pytest.raises(ValueError, match="--compress toy16 applies to --protocol bsp or ssp"):
        resolve(data, "--protocol", "toymean", "--compress", "toy16")
    assert resolve(data, "--protocol", "bsp", "--compress", "toy16").compression.compress == "toy16"
    with pytest.raises(ValueError, match="toy16 takes no argument"):
        resolve(data, "--protocol", "bsp", "--compress", "toy16:3")
    for name in ("asp", "ssp"):
        plan = resolve(data, "--protocol", name, "--staleness-comp", "toyhalf")
        assert plan.compensation.staleness_comp == "toyhalf"
    with pytest.raises(ValueError, match="toyhalf does not apply to --protocol bsp"):
        resolve(data, "--protocol", "bsp", "--staleness-comp", "toyhalf")
    assert resolve(data, "--protocol", "asp", "--optimizer", "momentum", "--momentum-correction",
                   "on", "--staleness-comp", "toyhalf").compensation.staleness_comp == "toyhalf"
    with pytest.raises(ValueError, match="'toyhalf' is registered already"):
        compensation.register(compensation.METHODS["toyhalf"])


def test_plan_and_the_job_scripts_check_take_the_toy_protocol(toys, tmp_path):
    from psgd.plan.cost import Job, Network, predict, ring_step_s
    from test_job_scripts import check_example_config
    job, net = Job(n_params=10_000, compute_s=1e-4, batch=32, workers=4), Network(1e8)
    assert predict(job, net)["toymean"]["step_s"] == pytest.approx(ring_step_s(job, net))
    data = tmp_path / "d.h5"
    data.touch()
    check_example_config(protocols.get("toymean"), data=data)


def test_the_toy_layer_parses_and_its_backward_matches_finite_differences(toys):
    layers, _ = spec.build_layers("flatten-dense:8-softsign-dense:3", (1, 4, 4))
    layer = next(x for x in layers if type(x).__name__ == "Softsign")
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    y = layer.forward(x.copy())
    np.testing.assert_allclose(y, x / (1 + np.abs(x)), rtol=1e-6)
    dy = np.random.default_rng(1).normal(size=y.shape).astype(np.float32)
    dx = layer.backward(dy.copy())
    x64, h = x.astype(np.float64), 1e-6
    numeric = ((x64 + h) / (1 + np.abs(x64 + h)) - (x64 - h) / (1 + np.abs(x64 - h))) / (2 * h)
    np.testing.assert_allclose(dx, dy * numeric, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="token 3 'softsign:2' takes no arguments"):
        spec.build_layers("flatten-dense:8-softsign:2-dense:3", (1, 4, 4))
    with pytest.raises(ValueError, match=r"is not a layer; expected one of: .*softsign \(a toy"):
        spec.build_layers("flatten-dense:8-softplus-dense:3", (1, 4, 4))


def test_the_toy_codec_round_trips_as_numpy_half_precision(toys):
    codec = compress.make("toy16")
    grad = np.random.default_rng(0).normal(size=1000).astype(np.float32) * 1e-3
    frame = np.zeros(codec.max_bytes(grad.size), np.uint8)
    length = codec.encode(grad, frame)
    dst = np.ones_like(grad)
    codec.decode_add(frame[:length], dst)
    np.testing.assert_array_equal(dst, 1 + grad.astype(np.float16).astype(np.float32))


def train(mpirun, ranks, dataset, ckdir, *flags):
    from psgd.run.checkpoint import list_checkpoints, load_checkpoint
    mpirun(ranks, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--model", MODEL,
                   "--batch-size", 16, "--optimizer", "sgd", "--lr", "0.05", "--steps", 12,
                   "--checkpoint-dir", ckdir, *flags], env=ENV, timeout=180)
    return load_checkpoint(list_checkpoints(ckdir)[-1]).params


def test_the_toys_train_end_to_end(mpirun, dataset, tmp_path):
    """toymean with the softsign layer ends where allreduce ends (float32 sums in another
    order); bsp pushing through toy16 ends exactly where psgd's own fp16 ends."""
    mean = train(mpirun, 2, dataset, tmp_path / "a", "--protocol", "toymean", "--servers", 0)
    ring = train(mpirun, 2, dataset, tmp_path / "b", "--protocol", "allreduce", "--servers", 0)
    np.testing.assert_allclose(mean, ring, rtol=1e-5, atol=1e-6)
    toy = train(mpirun, 3, dataset, tmp_path / "c", "--protocol", "bsp", "--compress", "toy16")
    fp16 = train(mpirun, 3, dataset, tmp_path / "d", "--protocol", "bsp", "--compress", "fp16")
    np.testing.assert_array_equal(toy, fp16)
    assert not np.array_equal(toy, mean)
    # one worker: every push is fresh and the runs are deterministic
    half = train(mpirun, 2, dataset, tmp_path / "e", "--protocol", "asp", "--staleness-comp",
                 "toyhalf")
    slow = train(mpirun, 2, dataset, tmp_path / "f", "--protocol", "asp", "--staleness-comp",
                 "none", "--lr", "0.025")
    np.testing.assert_array_equal(half, slow)
    assert not np.array_equal(half, train(mpirun, 2, dataset, tmp_path / "g", "--protocol",
                                          "asp", "--staleness-comp", "none"))


def test_the_fault_tests_take_the_toy_protocol(toys, mpirun, dataset):
    from test_faults import check_failed_rank
    check_failed_rank(mpirun, dataset, "toymean", "worker", "raise", env=ENV)
