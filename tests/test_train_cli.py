"""Settings resolution (flag > TOML > PSGD_* > default) and validation of `psgd train` flags."""

import pytest
from conftest import parse_train

from psgd.cli import build_parser
from psgd.run.settings import load_toml, resolve


def test_flag_beats_toml_beats_env_beats_default(tmp_path, data):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[train]\ndata = "{data}"\nlr = 0.2\nbatch-size = 32\nprotocol = "asp"\n')
    env = {"PSGD_LR": "0.3", "PSGD_BATCH_SIZE": "16", "PSGD_SEED": "7"}
    s = resolve(parse_train("--config", str(cfg), "--lr", "0.1"), environ=env)
    assert (s.lr, s.batch_size, s.seed, s.protocol) == (0.1, 32, 7, "asp")
    assert s.momentum == 0.9 and s.servers == 1


def test_defaults_fill_protocol_dependent_values(data):
    s = resolve(parse_train("--data", data), environ={})
    assert (s.protocol, s.staleness, s.servers) == ("ssp", 2, 1)
    s = resolve(parse_train("--data", data, "--protocol", "allreduce"), environ={})
    assert s.servers == 0


def test_validation_fills_a_copy_and_leaves_its_input_as_it_was(data):
    from dataclasses import FrozenInstanceError

    from psgd.run.run_plan import RunPlan, validate
    given = RunPlan.from_flat(dict(data=data, protocol="asp", staleness_lr="inverse", log_every=0))
    before = given.as_dict()
    filled = validate(given)
    assert given.as_dict() == before
    assert (filled.servers, filled.compensation.staleness_comp, filled.optimizer,
            filled.log_every) == (1, "inverse", "sgd", 1)
    with pytest.raises(FrozenInstanceError):
        filled.lr = 0.5
    with pytest.raises(FrozenInstanceError):
        filled.compression.compress = "sign"


def test_the_plan_round_trips_through_its_flat_record(data):
    """as_dict gives one key per flag (the config record, checkpoints), from_flat reads it back."""
    from psgd.run.run_plan import RunPlan, validate
    from psgd.run.settings import FLAGS
    plan = validate(RunPlan.from_flat(dict(data=data, protocol="hogwild", model="linear",
                                           compress="none", straggler="0:slow=2")))
    flat = plan.as_dict()
    assert sorted(flat) == sorted(FLAGS)
    assert RunPlan.from_flat(flat) == plan
    assert plan.stragglers.straggler == "0:slow=2" and plan.hot_rows.hold_hot >= 1
    with pytest.raises(TypeError, match="unknown settings: hold_hotter"):
        RunPlan.from_flat({"hold_hotter": 2})


@pytest.mark.parametrize("argv, match", [
    (["--lr", "-1"], "--lr must be a positive"),
    (["--protocol", "bsp", "--staleness", "2"], "--staleness applies to --protocol ssp only"),
    (["--protocol", "gosip"], "--protocol 'gosip'"),
    (["--protocol", "allreduce", "--servers", "1"], "allreduce has no servers"),
    (["--protocol", "asp", "--servers", "0"], "needs at least one server"),
    (["--optimizer", "lbfgs"], "--optimizer 'lbfgs'"),
    (["--epochs", "1", "--steps", "5"], "not both"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--checkpoint-every", "10"], "needs --checkpoint-dir"),
    (["--staleness", "-1"], "--staleness must be >= 0"),
    (["--momentum", "1.0"], "--momentum"),
    (["--resume", "/nonexistent/ckpt.h5"], "no such file"),
    (["--straggler", "0:slow=0.5"], "slow=f needs f >= 1"),
    (["--straggler", "all:p=2,d=1"], r"p is a probability in \[0, 1\]"),
    (["--protocol", "bsp", "--staleness", "auto"], "--staleness auto applies to --protocol ssp"),
    (["--staleness", "4", "--staleness-max", "8"], "--staleness-max applies to --staleness auto"),
])
def test_bad_values_are_named(data, argv, match):
    with pytest.raises(ValueError, match=match):
        resolve(parse_train("--data", data, *argv), environ={})


def test_staleness_auto_resolves_to_its_maximum(data):
    s = resolve(parse_train("--data", data, "--staleness", "auto"), environ={})
    assert (s.staleness, s.staleness_max) == ("auto", 16)
    s = resolve(parse_train("--data", data), environ={"PSGD_STALENESS": "AUTO", "PSGD_STALENESS_MAX": "5"})
    assert (s.staleness, s.staleness_max) == ("auto", 5)
    with pytest.raises(SystemExit):   # argparse: "invalid an integer or auto value"
        parse_train("--staleness", "often")


def test_missing_data_file():
    with pytest.raises(ValueError, match="no such file"):
        resolve(parse_train("--data", "/nonexistent.h5"), environ={})
    with pytest.raises(ValueError, match="pass --data"):
        resolve(parse_train(), environ={})


def test_toml_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("lr = = 1")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_toml(str(bad))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[train]\nlearning_rate = 0.1\n")
    with pytest.raises(ValueError, match="unknown setting 'learning_rate'"):
        load_toml(str(unknown))
    typed = tmp_path / "typed.toml"
    typed.write_text('[train]\nbatch-size = "big"\n')
    with pytest.raises(ValueError, match="batch_size must be int"):
        load_toml(str(typed))
    with pytest.raises(ValueError, match="no such file"):
        load_toml(str(tmp_path / "none.toml"))


def test_bad_env_value(data):
    with pytest.raises(ValueError, match="PSGD_LR"):
        resolve(parse_train("--data", data), environ={"PSGD_LR": "fast"})


def test_unknown_flag_exits_2_with_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_train("--lrr", "0.1")
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unrecognized arguments: --lrr" in err[0]


def test_example_configs_parse():
    from pathlib import Path
    for cfg in sorted(Path(__file__).parent.parent.glob("jobs/configs/*.toml")):
        values = load_toml(str(cfg))
        assert values["protocol"] == cfg.stem


def test_version_and_every_run_length_default_are_told(capsys):
    import psgd
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"psgd {psgd.__version__}"
    with pytest.raises(SystemExit):
        parse_train("--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "--steps; default 1)" in text and "(exclusive with --epochs; default 1 epoch)" in text
    assert "--overwrite replace an existing --log" in text


def test_a_closed_stdout_ends_a_command_quietly(tmp_path):
    """`psgd data info F | head -0`: exit 1, and no BrokenPipeError on stderr."""
    import subprocess
    import sys
    from conftest import write_synth
    data = write_synth(tmp_path / "d.h5", 40, 20)
    proc = subprocess.Popen([sys.executable, "-m", "psgd", "data", "info", data],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                     # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1
    assert err == ""


def test_help_groups_the_flags_by_feature(capsys):
    """Every flag is in one section; each feature's section is its options class's flags."""
    from psgd.run.run_plan import FEATURES
    from psgd.run.settings import FLAGS, GROUPS
    grouped = [name for names in GROUPS.values() for name in names]
    assert len(grouped) == len(set(grouped)) and set(grouped) == set(FLAGS)
    assert all(GROUPS[f.TITLE] == tuple(f.FLAGS) for f in FEATURES)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    out = capsys.readouterr().out
    for title, names in GROUPS.items():
        section = out.split(f"\n{title}:\n")[1].split("\n\n")[0]
        for name in names:
            assert f"--{name.replace('_', '-')}" in section, (title, name)
