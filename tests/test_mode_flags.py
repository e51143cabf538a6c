"""The pipeline's and the elastic run's flags as options of the run plan: TOML keys, PSGD_<NAME>
variables, --help sections, the config record, and refusals from the protocols' declarations."""
import pytest

from conftest import parse_train
from psgd.errors import UsageError
from psgd.protocols import get
from psgd.run.mode_flags import DEFAULT_NO_WORKER_S, ElasticOptions, PipelineFlags, byte_count
from psgd.run.run_plan import DEFAULTS, FLAG_NAMES, refused_by
from psgd.run.tensor_flags import TensorOptions
from psgd.run.settings import FLAGS, GROUPS, given_settings, resolve


def test_pipeline_flags_come_from_a_toml_config_and_reach_the_record(tmp_path, data):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[train]\ndata = "{data}"\nprotocol = "allreduce"\npipeline = 2\n'
                   f'microbatches = 4\nschedule = "gpipe"\nmemory-per-rank = "200M"\n')
    plan = resolve(parse_train("--config", str(cfg), "--batch-size", "16"), environ={})
    opts = plan.pipeline.options()
    assert (opts.stages, opts.microbatches, opts.schedule) == (2, 4, "gpipe")
    assert opts.memory_per_rank == byte_count("200M") == 200 * 2 ** 20
    record = plan.as_dict()
    assert (record["pipeline"], record["microbatches"], record["schedule"]) == (2, 4, "gpipe")


def test_elastic_flags_come_from_variables_and_their_defaults_are_filled(data):
    env = {"PSGD_ELASTIC": "1", "PSGD_PORT_FILE": "run.port", "PSGD_MAX_WORKERS": "4"}
    plan = resolve(parse_train("--data", data, "--protocol", "asp"), environ=env)
    assert plan.elastic == ElasticOptions(elastic=True, port_file="run.port", max_workers=4,
                                          no_worker_timeout=DEFAULT_NO_WORKER_S, replicas=1)
    assert plan.as_dict()["max_workers"] == 4
    assert resolve(parse_train("--data", data), environ={}).elastic == ElasticOptions()


def test_the_modes_are_features_of_the_plan_with_a_help_section_each():
    """test_train_cli's --help test then finds each of their flags in its section."""
    from psgd.run.run_plan import FEATURES
    assert PipelineFlags in FEATURES and ElasticOptions in FEATURES
    assert GROUPS[PipelineFlags.TITLE] == tuple(PipelineFlags.FLAGS)
    assert GROUPS[ElasticOptions.TITLE] == tuple(ElasticOptions.FLAGS)
    assert set(PipelineFlags.FLAGS) | set(ElasticOptions.FLAGS) <= set(FLAGS)


@pytest.mark.parametrize("protocol, schedule", [("bsp", "pipedream"), ("hogwild", "gpipe"),
                                                ("gossip", "1f1b")])
def test_a_schedule_the_protocol_cannot_combine_is_refused_with_its_declared_reason(
        data, protocol, schedule):
    argv = ["--data", data, "--protocol", protocol, "--pipeline", "2", "--schedule", schedule]
    with pytest.raises(ValueError) as err:
        resolve(parse_train(*argv, "--optimizer", "sgd"), environ={})
    line = str(err.value)
    assert line.startswith(f"--protocol {protocol} does not combine the replicas of a "
                           f"--schedule {schedule} pipeline{get(protocol).why_not('pipeline')}; ")
    assert get(protocol).reasons["pipeline"] in line


@pytest.mark.parametrize("protocol", ["gossip"])
def test_elastic_under_a_protocol_without_the_ability_gives_its_declared_reason(data, protocol):
    with pytest.raises(UsageError) as err:
        resolve(parse_train("--data", data, "--protocol", protocol, "--optimizer", "sgd", "--elastic",
                      "--port-file", "p"), environ={})
    line = str(err.value)
    assert line.startswith("--elastic runs --protocol bsp or ssp or asp or allreduce or adpsgd "
                           "or hogwild so far, not " + protocol)
    assert line.endswith(get(protocol).why_not("elastic")) and get(protocol).why_not("elastic")


@pytest.mark.parametrize("env, message", [
    ({"PSGD_MICROBATCHES": "4"}, "--microbatches applies to pipeline runs; give --pipeline K"),
    ({"PSGD_MAX_WORKERS": "4"}, "--max-workers applies with --elastic only"),
    ({"PSGD_PIPELINE": "2", "PSGD_WEIGHT_STASHING": "maybe"}, "--weight-stashing must be on or off"),
    ({"PSGD_ELASTIC": "yes"}, "--elastic needs --port-file"),
    ({"PSGD_PIPELINE": "2", "PSGD_MEMORY_PER_RANK": "lots"},
     "PSGD_MEMORY_PER_RANK: memory_per_rank must be byte_count, got 'lots'"),
])
def test_a_mode_flag_from_a_variable_is_checked_like_the_flag(data, env, message):
    with pytest.raises(ValueError, match=message):
        resolve(parse_train("--data", data, "--protocol", "asp"), environ=env)


def test_a_setting_a_pipeline_does_not_run_is_refused_from_a_toml_config_too(tmp_path, data):
    cfg = tmp_path / "c.toml"
    cfg.write_text('pipeline = 2\ncompress = "sign"\n')
    given = given_settings(parse_train("--config", str(cfg), "--data", data), environ={})
    assert refused_by(PipelineFlags(), given).startswith("--compress does not work under --pipeline")
    assert PipelineFlags.from_flat(given).pipeline == 2


@pytest.mark.parametrize("flag, value", [("--tensor", "2"), ("--spatial", "2"), ("--grid", "1,2"),
                                         ("--elastic", None)])
def test_a_pipeline_refuses_the_modes_it_cannot_combine_with(data, flag, value):
    """The pipeline mode declares the layer splits and --elastic refused: a run keeps --tensor
    and --grid D,T only where psgd.tensor.pipeline builds the stages split (a gpipe or 1f1b
    schedule, no servers; tests/test_tensor_pipeline.py), and refuses the rest, not run as a
    plain pipeline."""
    argv = ["--data", data, "--pipeline", "2", flag] + ([value] if value else [])
    line = refused_by(PipelineFlags(), given_settings(parse_train(*argv), environ={}))
    assert line is not None and line.startswith(f"{flag} does not work under --pipeline")


@pytest.mark.parametrize("split", [["--tensor", "2"], ["--spatial", "2"], ["--grid", "auto"]])
def test_elastic_refuses_a_split_model(data, split):
    with pytest.raises(UsageError, match="--elastic runs the whole model on every worker"):
        resolve(parse_train("--data", data, "--protocol", "ssp", "--staleness", "2", "--elastic",
                            "--port-file", "p", *split), environ={})


def test_byte_counts_read_suffixes_and_toml_integers():
    assert (byte_count("4096"), byte_count("2k"), byte_count("1.5G"), byte_count(7)) == \
        (4096, 2048, 3 * 2 ** 29, 7)
    with pytest.raises(SystemExit):   # argparse's one line
        parse_train("--pipeline", "2", "--memory-per-rank", "lots")


def _set(value):
    """A value other than the default ``value``."""
    return True if value is False else "x" if value is None else value + type(value)(1) \
        if isinstance(value, (int, float)) else value + "x"


@pytest.mark.parametrize("mode", [PipelineFlags(pipeline=2), TensorOptions(tensor=2),
                                  TensorOptions(spatial=2)])
def test_each_mode_refuses_exactly_the_settings_it_declares_and_not_their_defaults(mode):
    defaults = DEFAULTS.as_dict()
    for name in FLAG_NAMES:
        line = refused_by(mode, {name: _set(defaults[name])})
        assert (line is not None) == (name in mode.REFUSES), name
        if line:
            assert line == mode.refusal(name, mode.REFUSES[name])
            assert line.startswith(f"--{name.replace('_', '-')} ")
        assert refused_by(mode, {name: defaults[name]}) is None
