"""PSGD_* variables: every one psgd reads is a flag's or a documented knob, and none is
ignored silently (the config record lists those read; a notice names the others)."""
import json
import re
from pathlib import Path

from psgd.env import KNOBS, psgd_variables
from psgd.run.settings import FLAG_VARIABLES

ROOT = Path(__file__).resolve().parent.parent


def test_every_variable_the_source_names_is_a_flags_or_a_knob():
    named = set()
    for path in list((ROOT / "psgd").rglob("*.py")) + list((ROOT / "kernels").rglob("*.py")):
        named |= set(re.findall(r"PSGD_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    named -= {"PSGD_X_ALLREDUCE"}   # the prefix of the PSGD_X_ALLREDUCE_*_BYTES family, in prose
    assert named - KNOBS.keys() - FLAG_VARIABLES == set()


def test_internal_knobs_carry_the_x_prefix_that_no_flag_variable_can_take():
    user_facing = {"PSGD_PLUGINS", "PSGD_PROGRESS", "PSGD_MPIEXEC", "PSGD_DEMO_DIR"}
    assert all(name.startswith("PSGD_X_") for name in KNOBS.keys() - user_facing)
    assert not [name for name in FLAG_VARIABLES if name.startswith("PSGD_X_")]


def test_the_guide_lists_exactly_the_knobs():
    page = (ROOT / "docs" / "guide" / "environment.md").read_text()
    assert set(re.findall(r"^\| `(PSGD_[A-Z0-9_]+)` \|", page, re.M)) == set(KNOBS)


def test_variables_are_sorted_into_read_and_ignored():
    known, unknown = psgd_variables(FLAG_VARIABLES, {"PSGD_LOG": "/tmp/x", "PSGD_LOGG": "1",
                                                     "PSGD_X_FAULT": "rank=1", "HOME": "/"})
    assert known == {"PSGD_LOG": "/tmp/x", "PSGD_X_FAULT": "rank=1"} and unknown == ["PSGD_LOGG"]


def test_a_flags_variable_is_honoured_and_recorded_and_a_stray_one_is_named(mpirun, dataset,
                                                                            tmp_path):
    log = tmp_path / "x.jsonl"
    proc = mpirun(2, ["-m", "psgd", "train", "--data", dataset, "--protocol", "allreduce",
                      "--servers", 0, "--model", "mlp:784-16-10", "--steps", 2, "--quiet"],
                  env={"PSGD_LOG": str(log), "PSGD_LOGG": "y"})
    notices = [line for line in proc.stderr.splitlines() if line.startswith("psgd: notice:")]
    assert notices == ["psgd: notice: ignoring PSGD_LOGG: not a psgd flag's variable or knob "
                       "(docs/guide/environment.md)"]
    config = json.loads(log.read_text().splitlines()[0])
    assert config["log"] == str(log) and config["environment"]["PSGD_LOG"] == str(log)
    assert "PSGD_LOGG" not in config["environment"]
