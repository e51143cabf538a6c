"""--straggler: spec parsing and its errors, the slow-down asked of each worker, seeded pauses, and the measured slow-down under mpiexec."""
import pytest

from psgd.run import straggler
from psgd.run.metrics import read_log


@pytest.mark.parametrize("spec, match", [
    ("1:slow=0.5", "f >= 1"),
    ("all:p=1.5,d=0.1", r"p is a probability in \[0, 1\]"),
    ("all:p=-0.1,d=0.1", r"p is a probability in \[0, 1\]"),
    ("0:p=0.1", "needs both p > 0 and d > 0"),
    ("0:slow=x", "slow must be a number"),
    ("0:fast=2", "unknown key 'fast'"),
    ("zero:slow=2", "workers must be all, k or a-b"),
    ("3-1:slow=2", "not a range"),
    ("slow=2", "expected WORKERS:KEY=VALUE"),
])
def test_bad_spec_is_named(spec, match):
    with pytest.raises(ValueError, match=match):
        straggler.parse(spec)


def test_spec_naming_a_missing_worker_is_named():
    with pytest.raises(ValueError, match="names worker 2, but the job has 2 workers"):
        straggler.for_worker("0:slow=2;2:slow=3", 0, 2)
    with pytest.raises(ValueError, match="names worker 3"):
        straggler.for_worker("1-3:p=0.1,d=1", 1, 3)


def test_entries_combine_per_worker():
    spec = "1:slow=3; all:p=0.25,d=2x; 0-1:slow=2"
    w0, w1, w2 = (straggler.for_worker(spec, w, 3) for w in range(3))
    assert (w0.factor, w1.factor, w2.factor) == (2.0, 6.0, 1.0)
    assert all((w.p, w.d, w.d_relative) == (0.25, 2.0, True) for w in (w0, w1, w2))
    assert straggler.make(None, 0, 0, 2) is None
    assert straggler.make("1:slow=3", 0, 0, 2) is None   # worker 0 is left alone


def test_slowdown_sleeps_f_minus_one_times_the_compute():
    asked = []
    s = straggler.Straggler(straggler.Slowdown(factor=3.0), seed=0, worker=1, sleep=asked.append)
    for clock, compute in enumerate([0.01, 0.02, 0.005]):
        s.after_compute(clock, compute)
    assert asked == pytest.approx([0.02, 0.04, 0.01])
    assert s.pauses == []


def test_transient_pauses_repeat_with_the_seed_and_hit_p_of_the_clocks():
    def pauses(seed, worker, clocks=4000, d="0.5"):
        asked = []
        slow = straggler.for_worker(f"all:p=0.1,d={d}", worker, 2)
        s = straggler.Straggler(slow, seed=seed, worker=worker, sleep=asked.append)
        for c in range(clocks):
            s.after_compute(c, 0.01)
        return s.pauses, asked

    a, asked = pauses(0, 0)
    assert pauses(0, 0)[0] == a                 # the same seed and worker: the same clocks
    assert pauses(1, 0)[0] != a and pauses(0, 1)[0] != a
    assert 0.085 < len(a) / 4000 < 0.115        # p = 0.1: 400 +- 5 sigma (19)
    assert asked == [0.5] * len(a)
    _, relative = pauses(0, 0, d="5x")          # five times the mean compute so far
    assert relative == pytest.approx([0.05] * len(a))
    # after a resume at clock 1000 the pauses are those of the uninterrupted run
    s = straggler.Straggler(straggler.for_worker("all:p=0.1,d=1", 0, 2), 0, 0, sleep=lambda t: 0)
    assert [c for c in range(1000, 4000) if s.pauses_at(c)] == [c for c in a if c >= 1000]


def test_straggler_slows_exactly_the_chosen_worker_by_its_factor(mpirun, dataset, tmp_path):
    log = tmp_path / "run.jsonl"
    mpirun(4, ["-m", "psgd", "train", "--data", dataset, "--model", "mlp:784-512-512-10",
               "--protocol", "asp", "--steps", 40, "--quiet", "--log", log,
               "--straggler", "1:slow=3"], timeout=180)
    records = read_log(log)
    config = next(r for r in records if r["kind"] == "config")
    assert config["straggler"] == "1:slow=3"
    workers = next(r for r in records if r["kind"] == "summary")["workers"]
    by_index = {w["rank"] - 1: w for w in workers}
    for index, w in by_index.items():
        step = (w["compute_s"] + w["straggle_s"]) / w["steps"]   # a step's busy time
        ratio = step / (w["compute_s"] / w["steps"])
        if index == 1:
            assert 2.8 < ratio < 3.4, w
        else:
            assert w["straggle_s"] == 0.0, w


def test_straggler_seed_draws_other_pauses_and_needs_a_straggler(tmp_path):
    """--straggler-seed N: the pauses of a run seeded N, whatever --seed; refused alone."""
    from psgd.run.run_plan import RunPlan, validate
    data = tmp_path / "d.h5"
    data.write_bytes(b"")   # existence is all that validation checks

    def pauses(**flags):
        plan = validate(RunPlan.from_flat(dict(data=str(data), straggler="all:p=0.2,d=1",
                                               **flags)))
        slow = plan.stragglers.make(plan.seed, 1, 2)
        return [c for c in range(2000) if slow.pauses_at(c)]

    def reference(seed):
        slow = straggler.Straggler(straggler.for_worker("all:p=0.2,d=1", 1, 2), seed, 1)
        return [c for c in range(2000) if slow.pauses_at(c)]

    assert pauses() == reference(0) and pauses(seed=3) == reference(3)
    assert pauses(seed=3, straggler_seed=7) == pauses(straggler_seed=7) == reference(7)
    assert reference(7) != reference(0)
    with pytest.raises(ValueError, match="--straggler-seed applies with --straggler"):
        validate(RunPlan.from_flat(dict(data=str(data), straggler_seed=7)))
