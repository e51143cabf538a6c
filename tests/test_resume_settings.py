"""A run owns its checkpoints and log: resume restores its settings; another run's files are kept."""
import argparse
import os

import numpy as np
import pytest

from psgd.run import settings
from psgd.run.checkpoint import Checkpoint, list_checkpoints, load_checkpoint, save_checkpoint
from psgd.run.metrics import read_log
from psgd.run.run_plan import RunPlan, validate

MLP = "mlp:784-32-10"


def parse(*flags) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return parser.parse_args([str(f) for f in flags])


def resolve_run(*flags):
    return settings.resolve_run(parse(*flags), environ={})


def saved_run(directory, data, run_id="run-a", step=40, **changes):
    """A checkpoint as `psgd train` saves it: its run's validated settings in the header."""
    run = RunPlan.from_flat(dict(data=str(data), model=MLP, optimizer="adam", lr=0.001,
                                 protocol="ssp", staleness=3, epochs=2.0, **changes))
    run = validate(run)
    ckpt = Checkpoint(params=np.zeros(784 * 32 + 32 + 32 * 10 + 10, np.float32), model_spec=MLP,
                      step=step, optimizer=run.optimizer, config=run.as_dict(), run_id=run_id)
    return save_checkpoint(directory, ckpt)


def test_resume_restores_every_setting_of_the_run(tmp_path, dataset):
    path = saved_run(tmp_path / "ck", dataset)
    s, resumed = resolve_run("--resume", path)
    assert (s.model, s.optimizer, s.lr, s.protocol, s.staleness, s.epochs) == \
        (MLP, "adam", 0.001, "ssp", 3, 2.0)
    assert s.data == dataset and s.resume == str(path)
    assert (resumed.step, resumed.run_id, resumed.changed) == (40, "run-a", [])


def test_a_flag_on_the_resume_command_wins_and_is_named(tmp_path, dataset):
    path = saved_run(tmp_path / "ck", dataset)
    s, resumed = resolve_run("--resume", tmp_path / "ck", "--lr", "0.002", "--optimizer", "adam")
    assert s.lr == 0.002
    assert resumed.changed == ["lr 0.001 -> 0.002"]
    assert resumed.path == path


def test_another_protocol_resolves_its_own_bound_and_servers(tmp_path, dataset):
    saved_run(tmp_path / "ck", dataset)
    s, resumed = resolve_run("--resume", tmp_path / "ck", "--protocol", "allreduce")
    assert (s.protocol, s.servers, s.staleness) == ("allreduce", 0, None)
    assert s.lr == 0.001
    assert resumed.changed == ["protocol ssp -> allreduce"]


def test_steps_on_the_resume_command_replace_the_runs_epochs(tmp_path, dataset):
    saved_run(tmp_path / "ck", dataset)
    s, _ = resolve_run("--resume", tmp_path / "ck", "--steps", "90")
    assert (s.steps, s.epochs) == (90, None)


def test_how_an_attempt_runs_is_not_taken_from_the_checkpoint(tmp_path, dataset):
    saved_run(tmp_path / "ck", dataset, quiet=True, stall_timeout=5.0)
    s, _ = resolve_run("--resume", tmp_path / "ck")
    assert (s.quiet, s.stall_timeout) == (False, 60.0)


def test_an_existing_log_is_refused_unless_resumed_or_overwritten(tmp_path, dataset):
    log = tmp_path / "run.jsonl"
    log.write_text('{"kind": "config"}\n')
    with pytest.raises(ValueError, match=r"--log .*run.jsonl exists \(another run's log\).*"
                                         r"--resume.*--overwrite"):
        resolve_run("--data", dataset, "--log", log)
    assert resolve_run("--data", dataset, "--log", log, "--overwrite")[0].overwrite
    path = saved_run(tmp_path / "ck", dataset)
    assert resolve_run("--resume", path, "--log", log)[0].log == str(log)


def test_retention_counts_only_this_runs_checkpoints(tmp_path, dataset):
    ck = tmp_path / "ck"
    for step in (200, 279):
        saved_run(ck, dataset, run_id="old", step=step)
    for step in (20, 40, 60, 80):
        saved_run(ck, dataset, run_id="new", step=step)
    assert [p.name for p in list_checkpoints(ck, "old")] == ["ckpt-00000200.h5", "ckpt-00000279.h5"]
    assert [p.name for p in list_checkpoints(ck, "new")] == \
        ["ckpt-00000040.h5", "ckpt-00000060.h5", "ckpt-00000080.h5"]
    assert load_checkpoint(ck / "ckpt-00000279.h5").run_id == "old"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_a_checkpoint_gets_the_mode_of_a_new_file_under_the_umask(tmp_path, dataset, umask, mode):
    old = os.umask(umask)
    try:
        path = saved_run(tmp_path / "ck", dataset)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == mode


def train(mpirun, data, *flags, check=True, cwd=None):
    return mpirun(3, ["-m", "psgd", "train", "--data", data, "--quiet", *map(str, flags)],
                  timeout=180, check=check, cwd=cwd)


def steps(log):
    return [r for r in read_log(log) if r["kind"] == "step"]


def test_an_adam_run_resumes_at_its_own_learning_rate(mpirun, dataset, tmp_path):
    ck, log = tmp_path / "ck", tmp_path / "run.jsonl"
    train(mpirun, dataset, "--model", MLP, "--protocol", "ssp", "--optimizer", "adam", "--lr",
          "0.001", "--batch-size", 32, "--steps", 40, "--log-every", 10, "--log", log,
          "--checkpoint-dir", ck, "--checkpoint-every", 20)
    first = steps(log)
    # as the user did: only the optimizer named again, and a longer run
    out = train(mpirun, dataset, "--resume", ck, "--optimizer", "adam", "--steps", 80).stdout
    assert f"from {ck}/ckpt-00000040.h5 at step 40; changed: steps 40 -> 80" in out
    resumed = steps(log)[len(first):]           # the log is the run's: appended to
    assert [r["step"] for r in resumed] == [50, 60, 70, 80]
    assert {r["lr"] for r in resumed} == {0.001}
    assert resumed[-1]["loss"] < first[-1]["loss"] + 0.05 < first[0]["loss"]
    assert [p.name for p in list_checkpoints(ck)][-1] == "ckpt-00000080.h5"


def test_a_new_run_neither_deletes_nor_resumes_another_runs_checkpoints(mpirun, dataset,
                                                                        tmp_path):
    ck = tmp_path / "ck"
    common = ["--model", MLP, "--protocol", "allreduce", "--batch-size", 16,
              "--checkpoint-dir", ck, "--checkpoint-every", 10]
    train(mpirun, dataset, *common, "--steps", 30)
    old = {p.name: load_checkpoint(p).run_id for p in list_checkpoints(ck)}
    assert sorted(old) == ["ckpt-00000010.h5", "ckpt-00000020.h5", "ckpt-00000030.h5"]
    proc = train(mpirun, dataset, *common, "--steps", 20, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"psgd: error: --checkpoint-dir {ck} holds another run's checkpoints (newest "
        f"ckpt-00000030.h5): continue that run with --resume {ck}, replace them with "
        f"--overwrite, or give another --checkpoint-dir"]
    assert {p.name: load_checkpoint(p).run_id for p in list_checkpoints(ck)} == old
    out = train(mpirun, dataset, *common, "--steps", 20, "--overwrite").stdout
    assert "removed 3 checkpoint(s) of another run" in out
    assert out.strip().splitlines()[-1] == f"psgd: checkpoint: {ck}/ckpt-00000020.h5"
    new = {p.name: load_checkpoint(p).run_id for p in list_checkpoints(ck)}
    assert sorted(new) == ["ckpt-00000010.h5", "ckpt-00000020.h5"]
    assert len(set(new.values())) == 1 and set(new.values()).isdisjoint(old.values())
