"""`psgd train --plan auto|FILE`: the chosen plan runs; a model over the memory budget gets a
pipeline or tensor plan; bad plans and flags the plan sets are one line."""
import json
import subprocess
import sys

import pytest

from psgd.run.metrics import read_log
from psgd.plan import memory, profile as profiles
from psgd.plan.auto import as_dict, get_profile
from psgd.plan.cost import Network
from psgd.plan.inputs import train_bytes
from psgd.plan.search import Budget, search


@pytest.fixture(autouse=True)
def _short_crowd(monkeypatch):
    """The profile's crowd ratios over 10 ms of steps (subprocesses too): their values are not
    what these tests check."""
    monkeypatch.setenv("PSGD_X_CROWD_SECONDS", "0.01")
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "1")

BIG = "mlp:784-512-512-10"        # 2.7 MB of parameters: a data-parallel worker holds 3x that


def train(mpirun, n, dataset, *flags, check=True):
    return mpirun(n, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--steps", "5",
                      *map(str, flags)], timeout=180, check=check)


def peak_rss(out) -> list[int]:
    """Each rank's peak resident bytes from tests/mpi/peak_rss.py's lines."""
    return [int(x.split()[2]) for x in out.stdout.splitlines() if x.startswith("PEAK_RSS")]


def fresh_profile(path, model=BIG) -> "profiles.Profile":
    """``model``'s profile as `psgd plan --auto` makes it, in a process of its own (so that the
    base it reads is not this test process's)."""
    subprocess.run([sys.executable, "-m", "psgd", "plan", "--auto", "--model", model, "--ranks", "2",
                    "--memory-per-rank", "1T", "--profile", str(path)], check=True,
                   capture_output=True, timeout=120)
    return profiles.load(str(path))


@pytest.mark.mpi
def test_plan_auto_runs_a_model_parallel_plan_when_the_model_exceeds_the_budget(
        mpirun, dataset, tmp_path):
    prof_path, log = tmp_path / "p.json", tmp_path / "log.jsonl"
    prof = get_profile(BIG, str(prof_path))
    budget = prof.base_bytes + train_bytes(dataset) + (5 << 20)
    out = train(mpirun, 2, dataset, "--model", BIG, "--plan", "auto", "--memory-per-rank",
                budget, "--profile", prof_path, "--log", log)
    assert prof.base_bytes + memory.allreduce_worker(prof, 64, 0) > budget   # data parallelism cannot
    line = [x for x in out.stdout.splitlines() if x.startswith("psgd train: plan")][0]
    assert "--grid" in line or "--pipeline" in line, line
    summary = [r for r in read_log(log) if r["kind"] == "summary"][-1]
    if "--grid" in line:      # the model's split parameters against what the ranks held
        held = summary["param_bytes_per_rank"]
        modelled = memory.tensor_params(prof, 2)
        assert abs(held - modelled) <= 0.01 * held
        assert 2 * held <= budget - prof.base_bytes


@pytest.mark.mpi
@pytest.mark.parametrize("kind, model", [(k, BIG) for k in ("data", "pipeline", "tensor", "pipedream",
                                                              "pipemare")] + [("data", "lenet")])
def test_a_plans_measured_peak_rss_per_rank_is_within_its_memory(mpirun, dataset, tmp_path, kind,
                                                                 model):
    """The budget is the plan's own predicted bytes: the tightest budget it still fits (a conv
    net's: its layers' scratch counted)."""
    prof = fresh_profile(tmp_path / "p.json", model)
    fit, _ = search(prof, Budget(2, 1 << 40, Network(1.25e9), batch=64,
                                 data_bytes=train_bytes(dataset)))
    plan = next(p for p in fit if p.schedule == kind or p.kind == kind and p.sync)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(as_dict(plan, model, dataset)))
    out = mpirun(2, ["peak_rss.py", "train", "--data", dataset, "--quiet", "--steps", "5",
                     "--model", model, "--plan", path], timeout=180)
    peaks = peak_rss(out)
    assert len(peaks) == 2 and max(peaks) <= plan.memory, (peaks, plan.memory, plan.label())


@pytest.mark.mpi
def test_plan_auto_without_a_profile_reads_the_base_in_the_rank_and_stays_within_its_plan(
        mpirun, dataset):
    """No --profile: rank 0 profiles the model and reads the base in its own process;
    every rank's peak resident set is within the chosen plan's bytes."""
    out = mpirun(2, ["peak_rss.py", "train", "--data", dataset, "--quiet", "--steps", "5",
                     "--model", BIG, "--plan", "auto", "--memory-per-rank", "1G"], timeout=180)
    line = [x for x in out.stdout.splitlines() if x.startswith("psgd train: plan")][0]
    planned = float(line.split(" MB per rank")[0].split()[-1]) * 2**20
    peaks = peak_rss(out)
    assert len(peaks) == 2 and max(peaks) <= planned, (peaks, line)


@pytest.mark.mpi
def test_plan_file_runs_a_saved_pipeline_plan(mpirun, dataset, tmp_path):
    prof = get_profile(BIG, None, batch=8)      # its base is this process's, however large
    fit, _ = search(prof, Budget(2, prof.base_bytes + (1 << 30), Network(1.25e9), batch=64))
    plan = next(p for p in fit if p.kind == "pipeline" and p.sync)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(as_dict(plan, BIG, dataset)))
    out = train(mpirun, 2, dataset, "--model", BIG, "--plan", path)
    assert f"--pipeline 2 --microbatches {plan.microbatches}" in out.stdout
    assert f"--partition {','.join(map(str, plan.partition))}" in out.stdout
    wrong = train(mpirun, 3, dataset, "--model", BIG, "--plan", path, check=False)
    assert wrong.returncode != 0 and "is for 2 ranks, the job has 3" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1, wrong.stderr


@pytest.mark.mpi
def test_plan_file_runs_a_saved_spatial_plan(mpirun, dataset, tmp_path):
    prof = get_profile("lenet", None, batch=8)
    fit, _ = search(prof, Budget(2, 1 << 40, Network(1.25e9), batch=32))
    plan = next(p for p in fit if p.kind == "spatial")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(as_dict(plan, "lenet", dataset)))
    out = train(mpirun, 2, dataset, "--model", "lenet", "--plan", path)
    assert "--grid 1,2 --spatial 2" in out.stdout


@pytest.mark.mpi
def test_plan_file_runs_a_saved_auto_grid_plan_at_its_cut_and_network(mpirun, dataset, tmp_path):
    """A saved --grid D,auto row runs with its network flags: the run cuts where the plan
    said, on the plan's network."""
    from test_plan_grid import real_names, toy_profile
    net = Network(1e8 / 8, 20 * 1e-6)
    fit, _ = search(real_names(toy_profile("lenet")), Budget(2, 1 << 40, net, batch=32))
    plan = next(p for p in fit if p.kind == "grid")
    path, log = tmp_path / "plan.json", tmp_path / "run.jsonl"
    path.write_text(json.dumps(as_dict(plan, "lenet", dataset)))
    out = train(mpirun, 2, dataset, "--model", "lenet", "--plan", path, "--log", log)
    assert "--grid 1,auto --bandwidth 0.1gbit --latency-us 20 --per-node 1" in out.stdout
    summary = [r for r in read_log(log) if r["kind"] == "summary"][-1]
    assert summary["axis"] == "auto" and summary["auto_cut"] == plan.extra["cut"]
    assert summary["auto_network"] == "0.1 Gbit/s, 20 us per message, 1 rank(s) per node"


@pytest.mark.mpi
def test_a_bad_plan_file_or_a_budget_nothing_fits_is_one_line(mpirun, dataset, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for flags, words in [(["--plan", bad], "not a plan of psgd plan --auto"),
                         (["--plan", "auto", "--memory-per-rank", "100k"], "the smallest")]:
        out = train(mpirun, 2, dataset, "--model", BIG, *flags, check=False)
        assert out.returncode != 0 and words in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("flags, words", [
    (["--plan", "auto", "--pipeline", "2"], "--pipeline is chosen by --plan"),
    (["--plan", "auto"], "needs --model SPEC and --memory-per-rank"),
    (["--bandwidth", "1gbit"], "--bandwidth applies to --plan auto and --grid auto"),
    (["--grid", "auto", "--profile", "p.json"], "--profile applies to --plan auto"),
    (["--shm-bandwidth", "80gbit"], "--shm-bandwidth applies to --plan auto"),
    (["--grid", "auto", "--latency-us", "-1"], "--latency-us -1.0: must be >= 0"),
])
def test_flags_a_plan_sets_or_needs_are_refused_before_mpi(dataset, flags, words):
    out = subprocess.run([sys.executable, "-m", "psgd", "train", "--data", dataset, "--model",
                          BIG, *flags], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and words in out.stderr, out.stderr
