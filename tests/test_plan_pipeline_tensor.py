"""`psgd plan --auto`'s D x K x T rows (pipelines of tensor-split stages): where they appear,
their price against a hand count, and their command against `psgd train`'s set-up."""
import shlex
import subprocess
import sys

import pytest

from psgd.plan import profile as profiles
from psgd.plan.auto import command
from psgd.plan.cost import Network
from psgd.plan.profile import Profile, Unit
from psgd.plan.search import Budget, search

from test_plan_auto import SPEC, toy_profile

MLP = "mlp:784-32-32-16-10"    # the `dataset` fixture's 784 features and 10 classes


@pytest.fixture(autouse=True)
def _short_crowd(monkeypatch):
    monkeypatch.setenv("PSGD_X_CROWD_SECONDS", "0.01")
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "1")


def split_rows(plans):
    return [p for p in plans if p.kind == "pipeline" and p.parts > 1]


@pytest.mark.parametrize("ranks,shapes", [
    (2, set()), (3, set()), (5, set()),
    (4, {(1, 2, 2)}),
    (6, {(1, 2, 3), (1, 3, 2)}),
    (8, {(2, 2, 2), (1, 2, 4), (1, 4, 2)}),
])
def test_dxkxt_rows_appear_exactly_where_the_ranks_hold_k_and_t_of_at_least_two(ranks, shapes):
    fit, _ = search(toy_profile(), Budget(ranks, 1 << 40, Network(1.25e9), batch=8))
    assert {(p.replicas, p.stages, p.parts) for p in split_rows(fit)} == shapes
    for p in split_rows(fit):
        assert p.replicas * p.stages * p.parts == ranks and p.schedule in ("gpipe", "1f1b")
        assert p.protocol == "allreduce" and not p.servers and p.sync


def test_no_dxkxt_row_wider_than_the_narrowest_split_layer():
    # SPEC's last dense layer is 4 wide: T = 8 would leave parts without a column
    fit, _ = search(toy_profile(), Budget(16, 1 << 40, Network(1.25e9), batch=8))
    assert {p.parts for p in split_rows(fit)} == {2, 4}


def hand_profile(ratio=1.5):
    """Four dense units 8 -> 6 -> 6 -> 4 -> 4 of made-up times: per sample f, b seconds."""
    def dense(i, o, f, b):
        return Unit("dense+relu", f, b, 4 * i, 4 * o, 4 * (i * o + o), 4 * (i * o + o), o)
    units = (dense(8, 6, 1e-4, 2e-4), dense(6, 6, 1.1e-4, 2e-4), dense(6, 4, 1e-4, 2.1e-4),
             dense(4, 4, 1.2e-4, 1.9e-4))      # near-equal: every schedule and M cuts 2,2
    return Profile("mlp:8-6-6-4-4", 8, units, 1e-9, 1000, tensor_ratio=ratio, tensor_ratios={"2": ratio})


@pytest.mark.parametrize("schedule,m,again,flight", [
    ("gpipe", 2, (2, 2), (2, 1)),      # every backward re-runs its forward
    ("1f1b", 2, (2, 1), (2, 1)),       # the last stage's backward follows its own forward
    ("gpipe", 1, (1, 1), (1, 1)),      # one microbatch: no re-run
])
def test_a_dxkxt_rows_price_is_its_hand_counted_terms(schedule, m, again, flight):
    """K=2, T=2, D=1, batch 8, cut 2,2, each rank its own node (one link each): stage 0 is a
    column-row pair (the row's output all-reduced at each run of the forward); stage 1 the
    same, plus its column's input gradient all-reduced once (it is sent back whole); a 2-rank
    all-reduce of n bytes is n / bandwidth + 1 latency; stage 0 sends its output and takes
    the gradient back over its parts' own links."""
    from psgd.plan.pipeline_tensor import plan_fields
    prof, bw, lat = hand_profile(), 1e8, 1e-5
    budget = Budget(4, 1 << 40, Network(bw, lat), batch=8)
    row = plan_fields(prof, budget, 2, 2, m, schedule, None)
    assert row["partition"] == (2, 2)
    mb, (u0, u1, u2, u3) = 8 // m, prof.units
    ar = lambda n: mb * n / bw + lat                                         # noqa: E731
    compute = lambda u, a: 1.5 * mb * (a * u.forward_s + u.backward_s) / 2  # noqa: E731
    stage0 = compute(u0, again[0]) + compute(u1, again[0]) + again[0] * ar(u1.out_bytes) \
        + 2 * (mb * u1.out_bytes / bw + lat)
    stage1 = compute(u2, again[1]) + compute(u3, again[1]) + again[1] * ar(u3.out_bytes) + ar(u2.in_bytes)
    update = max(u0.param_bytes + u1.param_bytes, u2.param_bytes + u3.param_bytes) // 2 * 1e-9
    step = stage0 + stage1 + (m - 1) * max(stage0, stage1) + update
    assert row["extra"]["stage_s"] == pytest.approx([stage0, stage1], rel=1e-12)
    assert row["step_s"] == pytest.approx(step, rel=1e-12)
    assert row["bubble"] == pytest.approx(1 - m * (stage0 + stage1) / (2 * (step - update)))
    # memory: params/T x (param, grad, accumulation), the microbatches' inputs in flight at the
    # schedule's peak, one microbatch's outputs over T
    mem0 = 3 * (u0.param_bytes + u1.param_bytes) // 2 + flight[0] * mb * u0.in_bytes \
        + mb * (u0.out_bytes + u1.out_bytes) // 2
    mem1 = 3 * (u2.param_bytes + u3.param_bytes) // 2 + flight[1] * mb * u2.in_bytes \
        + mb * (u2.out_bytes + u3.out_bytes) // 2
    assert row["memory"] == budget.fixed(prof, 1) + max(mem0, mem1)


def test_dxkxt_rows_over_the_memory_cap_are_dropped_and_those_under_it_kept():
    prof = hand_profile()
    free = split_rows(search(prof, Budget(4, 1 << 40, Network(1e8), batch=8))[0])
    cap = sorted({p.memory for p in free})[1]          # the second smallest: some fit, some not
    fit = split_rows(search(prof, Budget(4, cap, Network(1e8), batch=8))[0])
    assert fit and all(p.memory <= cap for p in fit)
    assert {p.label() for p in free if p.memory <= cap} <= {p.label() for p in fit}
    assert len(fit) < len(free)


def test_the_dxkxt_command_is_one_psgd_train_sets_up_as_the_plan(dataset):
    """A 4-rank --pipeline 2 --tensor 2 row's words parse, and pipeline_job's set-up (on a
    stand-in communicator of 4 ranks) accepts them with the plan's K, T, M, schedule and cut."""
    from psgd.cli import build_parser
    from psgd.run import pipeline_job
    from psgd.tensor.pipeline import parts_of
    fit, _ = search(toy_profile(MLP), Budget(4, 1 << 40, Network(1.25e9), batch=16))
    plans = split_rows(fit)
    assert plans
    for plan in plans:
        words = command(plan, MLP, str(dataset))
        assert words[:3] == ["mpiexec", "-n", "4"] and "--tensor" in words
        args = build_parser(words[4:]).parse_args(words[4:])
        settings, _, opts = pipeline_job._setup(args, type("Comm", (), {"Get_size": lambda self: 4})())
        assert (opts.stages, parts_of(settings), opts.microbatches, opts.schedule) == \
            (plan.stages, plan.parts, plan.microbatches, plan.schedule)
        assert opts.counts() == list(plan.partition) and opts.recompute


def test_train_plan_auto_sets_the_dxkxt_rows_tensor_flag(dataset):
    """`psgd train --plan auto` applies a chosen D x K x T row's flags, --tensor T included
    (without it the run would train D T replicas of whole stages)."""
    from psgd.cli import build_parser
    from psgd.plan.auto import as_dict
    from psgd.run import pipeline_job
    from psgd.run.plan_job import apply
    from psgd.tensor.pipeline import parts_of
    fit, _ = search(toy_profile(MLP), Budget(4, 1 << 40, Network(1.25e9), batch=16))
    plan = split_rows(fit)[0]
    words = ["train", "--data", str(dataset), "--model", MLP]
    args = build_parser(words).parse_args(words)
    apply(args, as_dict(plan, MLP, str(dataset)))
    settings, _, opts = pipeline_job._setup(args, type("Comm", (), {"Get_size": lambda self: 4})())
    assert (opts.stages, parts_of(settings), opts.counts()) == (plan.stages, plan.parts, list(plan.partition))


@pytest.mark.mpi
def test_the_printed_dxkxt_command_trains(mpirun, dataset, tmp_path):
    """The table's --pipeline 2 --tensor 2 command for a tiny MLP, run for 3 steps on 4 ranks."""
    path = tmp_path / "p.json"
    profiles.save(toy_profile(MLP), path)
    out = subprocess.run([sys.executable, "-m", "psgd", "plan", "--auto", "--model", MLP, "--profile",
                          str(path), "--ranks", "4", "--memory-per-rank", "1G", "--batch", "16",
                          "--data", str(dataset), "--top", "200", "--bandwidth", "1gbit"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "not searched" not in out.stdout
    lines = [l.strip() for l in out.stdout.splitlines()]
    words = shlex.split(next(l for l in lines if l.startswith("mpiexec") and "--tensor 2" in l))
    assert words[:4] == ["mpiexec", "-n", "4", "psgd"]
    proc = mpirun(4, ["-m", "psgd", *words[4:], "--steps", 3, "--quiet", "--log", tmp_path / "l.jsonl"],
                  timeout=180)
    assert "psgd: pipeline of 2 stages x 2 tensor parts x 1 replica(s)" in proc.stdout, proc.stdout
