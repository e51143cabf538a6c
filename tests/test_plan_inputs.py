"""`psgd plan` on a model that takes its input shape from the data: the model, its profile and
its auto-grid layers are built on --data's shape, and a profile of other inputs is refused."""
from dataclasses import replace

import pytest

from psgd.data.synth import write_synthetic
from psgd.errors import PsgdError, UsageError
from psgd.plan import profile as profiles
from psgd.plan.auto import get_profile
from psgd.plan.grid import serial_layers
from psgd.plan.inputs import model_of_spec


@pytest.fixture(autouse=True)
def _short_crowd(monkeypatch):
    """The profile's crowd ratios over 10 ms of steps (subprocesses too): their values are not
    what these tests check."""
    monkeypatch.setenv("PSGD_X_CROWD_SECONDS", "0.01")
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "1")

TOKENS = "conv:4x3:pad1-relu-pool:2-flatten-dense:10"


@pytest.fixture(scope="module")
def colour(tmp_path_factory):
    return str(write_synthetic(tmp_path_factory.mktemp("plan") / "c.h5", 64, 16, channels=3))


def test_a_token_spec_is_built_on_the_datas_shape_and_its_profile_keeps_it(colour, tmp_path):
    model = model_of_spec(TOKENS, colour)
    assert tuple(model.input_shape) == (3, 32, 32) and model.n_classes == 10
    prof = profiles.profile_model(model, batch=4, repeats=1)
    assert (prof.input_shape, prof.n_classes) == ((3, 32, 32), 10)
    assert prof.units[0].in_bytes == 4 * 3 * 32 * 32
    assert [u.width for u in prof.units if u.split_bytes] == [4, 10]   # a conv's: its filters
    assert set(prof.tensor_ratios) == {2, 4}       # no split wider than the 4 filters is timed
    profiles.save(prof, tmp_path / "p.json")
    assert profiles.load(tmp_path / "p.json") == prof
    layers = serial_layers(prof.spec, prof.input_shape, prof.n_classes)
    assert [la.param_shapes() for la in layers] == [la.param_shapes() for la in model.layers]


def test_a_token_spec_without_data_is_one_line_naming_the_flag(tmp_path):
    for data in (None, str(tmp_path / "missing.h5")):
        with pytest.raises(PsgdError, match=r"takes its input shape from the data: pass --data FILE"):
            model_of_spec(TOKENS, data)
    assert serial_layers(TOKENS) is None
    assert model_of_spec("lenet", None).input_shape == (1, 28, 28)


def test_a_preset_follows_the_datas_shape_as_psgd_train_builds_it(colour, dataset):
    from psgd.data.reader import dataset_info
    from psgd.nn.model import build_model
    for path in (colour, dataset):
        info = dataset_info(path)
        want = build_model("cifar-cnn", input_shape=info["input_shape"], n_classes=info["n_classes"])
        assert model_of_spec("cifar-cnn", path).n_params == want.n_params
    assert model_of_spec("cifar-cnn", colour).n_params != model_of_spec("cifar-cnn", dataset).n_params


def test_a_saved_profile_of_other_inputs_is_refused_in_one_line(colour, dataset, tmp_path):
    model = model_of_spec(TOKENS, colour)
    prof = profiles.profile_model(model, batch=4, repeats=1)
    path = tmp_path / "p.json"
    profiles.save(replace(prof, base_bytes=1), path)
    assert get_profile(TOKENS, str(path), data=colour).input_shape == (3, 32, 32)
    with pytest.raises(UsageError, match=r"is of inputs 3x32x32, not 1x28x28"):
        get_profile(TOKENS, str(path), data=dataset)
