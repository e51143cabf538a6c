"""`psgd plan --auto`'s D x K x P rows (pipelines of stages split by rows, --pipeline K
--spatial P): where they appear, that every stage of their cut splits as the run splits it,
their collectives against the bytes a real split stage moves, their memory against a count,
and their command against `psgd train`."""
import shlex
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from psgd.plan import profile as profiles
from psgd.plan.auto import command
from psgd.plan.cost import Network
from psgd.plan.search import Budget, search

from test_plan_auto import SPEC, toy_profile
from test_plan_spatial import Recording


@pytest.fixture(autouse=True)
def _short_crowd(monkeypatch):
    monkeypatch.setenv("PSGD_X_CROWD_SECONDS", "0.01")
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "1")


def spatial_rows(plans):
    return [p for p in plans if p.kind == "pipeline" and p.axis == "spatial"]


def _layers(spec):
    from psgd.plan.grid import serial_layers
    return serial_layers(spec)


def _bounds(spec, counts):
    from psgd.pipeline.partition import layer_bounds
    return layer_bounds(type("M", (), {"layers": _layers(spec), "spec": spec})(), list(counts))


@pytest.mark.parametrize("spec,ranks,shapes", [
    (SPEC, 4, set()),                                  # no image: no row
    ("lenet", 2, set()), ("lenet", 3, set()),
    ("lenet", 4, {(1, 2, 2)}),
    ("lenet", 8, {(2, 2, 2), (1, 4, 2)}),    # P no more than the profile's spatial_max (2)
    ("cifar-cnn", 4, {(1, 2, 2)}),
])
def test_dxkxp_rows_appear_where_the_ranks_and_the_model_allow_them(spec, ranks, shapes):
    fit, _ = search(toy_profile(spec), Budget(ranks, 1 << 40, Network(1.25e9), batch=16))
    rows = spatial_rows(fit)
    assert {(p.replicas, p.stages, p.parts) for p in rows} <= shapes
    assert {(p.stages, p.parts) for p in rows} == {(k, t) for _, k, t in shapes}
    for p in rows:
        assert p.replicas * p.stages * p.parts == ranks and p.schedule in ("gpipe", "1f1b")
        assert p.protocol == "allreduce" and not p.servers and p.sync
        words = p.train_args()
        assert "--spatial" in words and "--tensor" not in words and "--recompute" not in words


def test_every_stage_of_a_dxkxp_cut_splits_as_the_run_splits_it():
    """The run refuses a stage without a conv or pool to split (the cut 6,2 of lenet): each
    row's cut is one whose every stage :func:`splits` accepts."""
    from psgd.tensor.spatial_stages import splits
    fit, _ = search(toy_profile("lenet"), Budget(8, 1 << 40, Network(1.25e9), batch=16))
    rows = spatial_rows(fit)
    assert rows
    layers = _layers("lenet")
    for p in rows:
        for a, b in _bounds("lenet", p.partition):
            assert splits(layers[a:b], (a, b), p.parts) is None, p.label()


def _stage_step(spec, span, comm, micro, first, monkeypatch):
    """One forward and backward of ``spec``'s layers ``span`` split by rows as rank ``comm``
    (a stage after the first returns its input gradient), each halo pass recorded."""
    from psgd.tensor import primitives as pr
    from psgd.tensor.model import TensorModel
    from psgd.tensor.spatial_stages import rows_split
    for name in ("halo_forward", "halo_adjoint"):
        def opened(*args, _f=getattr(pr, name)):
            comm.passes.append([0, 0])
            return _f(*args)
        monkeypatch.setattr(pr, name, opened)
    model = TensorModel(spec, rows_split(span), comm, span=span)
    x = np.random.default_rng(0).standard_normal((micro, *model.layers[0].in_shape)).astype(np.float32)
    for layer in model.layers:
        x = layer.forward(x)
    dy = np.ones_like(x)
    lowest = next(i for i, q in enumerate(model.layers) if q.param_shapes())
    for i in range(len(model.layers) - 1, -1, -1):
        dy = model.layers[i].backward(dy, need_dx=not first or i > lowest)
    monkeypatch.undo()
    return comm, model


@pytest.mark.parametrize("stage,parts", [(0, 2), (1, 2), (0, 3)])   # lenet's stage 1 leaves 14 rows: P <= 2
def test_a_dxkxp_stages_collectives_are_the_bytes_its_split_layers_move(stage, parts, monkeypatch):
    """lenet cut 3,5: the row's list of one stage's collectives (no re-run) carries what a real
    split stage's forward and backward move: its all-gathers (the output rows; after the
    first stage, the input gradient's rows too), every halo pass's bytes over all parts, and
    once a step the conv weights' partial gradient (the run's ``partial`` entries); the
    memory counts each part's whole parameters."""
    from psgd.plan.pipeline_spatial import ITEMSIZE, RowStages
    micro, spec = 4, "lenet"
    prof = toy_profile(spec)
    st = RowStages(prof, Budget(2 * parts, 1 << 40, Network(1e9), batch=micro), _layers(spec), 2, parts,
                   "gpipe", 1)
    i, j = (0, 3) if stage == 0 else (3, len(prof.units))
    span = _bounds(spec, (3, len(prof.units) - 3))[stage]
    ranks = [_stage_step(spec, span, Recording(parts, r), micro, stage == 0, monkeypatch) for r in range(parts)]
    got = {"all-gather": 0, "halo": 0, "partial": 0}
    for kind, values, runs, per_sample in st.collectives(i, j, stage == 1):
        n = int(np.sum(values)) * ITEMSIZE * (micro if per_sample else 1)
        got["partial" if not runs else kind] += n
        assert runs in (0, 1)
    sent = sum(s for c, _ in ranks for s, _ in c.passes)
    assert sent == sum(r for c, _ in ranks for _, r in c.passes) > 0
    assert got["halo"] == sent
    assert got["all-gather"] == ranks[0][0].bytes["all-gather"] > 0
    assert ranks[0][0].bytes["all-reduce"] == 0                  # the partial sums wait for the step
    model = ranks[0][1]
    assert got["partial"] == model.partial.size * ITEMSIZE > 0
    assert st.partial_bytes(i, j) == got["partial"]
    assert model.n_params * ITEMSIZE == sum(u.param_bytes for u in prof.units[i:j])   # whole on a part


def test_a_dxkxp_rows_memory_is_its_counted_terms():
    """K = 2, P = 2, D = 1, sgd: per part the stage's whole parameters x 3 (parameters,
    gradient, accumulation), the in-flight microbatches' whole inputs, and one microbatch's
    outputs: a split unit's as part 0 of the run's split layers holds them (lenet's 7 rows
    split 4, 3), the others whole (the toy profile has no scratch)."""
    from psgd.plan.cut import stage_in_flight
    from psgd.plan.pipeline_spatial import plan_fields
    from psgd.tensor.spatial_stages import RowsComm, rows_split
    prof, batch, m = toy_profile("lenet"), 16, 4
    budget = Budget(4, 1 << 40, Network(1.25e9), batch=batch)
    layers, spans = _layers("lenet"), _unit_spans(_layers("lenet"))
    assert all(u.scratch_at(4) == 0 for u in prof.units)
    for schedule in ("gpipe", "1f1b"):
        row = plan_fields(prof, budget, layers, 2, 2, m, schedule, None)
        assert row["partition"] == (3, 5)
        flight, mb, want = stage_in_flight(schedule, 2, m), batch // m, []
        for s, (i, j) in enumerate([(0, 3), (3, 8)]):
            a, b = spans[i][0], spans[j - 1][1]
            real = [q for q in rows_split((a, b))(list(layers[a:b]), RowsComm(0, 2))
                    if type(q).__name__ not in ("SplitHeight", "GatherHeight")]
            outs = 0
            for lo, hi in spans[i:j]:
                q = real[lo - a]           # the unit's first layer (an in-place ReLU keeps its serial shape)
                if type(q).__name__ == "SpatialWindow":
                    outs += 4 * int(np.prod(q.out_shape))
                    assert q.out_shape[0] < layers[lo].out_shape[0]
                else:
                    outs += 4 * int(np.prod(layers[hi - 1].out_shape))
            units = prof.units[i:j]
            want.append(3 * sum(u.param_bytes for u in units) + flight[s] * mb * units[0].in_bytes + mb * outs)
        assert row["memory"] == budget.fixed(prof, 1) + max(want), schedule
    # part 0's rows: lenet's second pool leaves 4 of 7 rows there, more than half
    assert want[1] > 3 * sum(u.param_bytes for u in prof.units[3:]) + flight[1] * mb * prof.units[3].in_bytes \
        + mb * sum(u.out_bytes // (2 if n < 2 else 1) for n, u in enumerate(prof.units[3:]))


def _unit_spans(layers):
    from psgd.pipeline.partition import units
    return units(type("M", (), {"layers": layers})())


def test_a_dxkxp_rows_step_is_its_stages_through_the_schedule_and_grows_with_the_halos():
    """The step is the schedule's span over the stage times plus the update; halving the
    bandwidth adds exactly the extra price of the stages' collectives, sends and update
    (links without latency: every price is bytes over bandwidth)."""
    from psgd.plan.cut import schedule_time
    from psgd.plan.pipeline_spatial import plan_fields
    prof, layers = toy_profile("lenet"), _layers("lenet")
    fast = Budget(4, 1 << 40, Network(1e8, latency=0.0), batch=16)
    slow = replace(fast, net=replace(fast.net, bandwidth=5e7))
    rows = [plan_fields(prof, b, layers, 2, 2, 4, "gpipe", None) for b in (fast, slow)]
    for row in rows:
        span, bubble = schedule_time(row["extra"]["stage_s"], 4, False)
        assert row["step_s"] == pytest.approx(span + row["extra"]["update_s"], rel=1e-12)
        assert row["bubble"] == pytest.approx(bubble)
    assert rows[0]["partition"] == rows[1]["partition"]
    comm = [np.array(r["extra"]["stage_s"]) for r in rows]
    compute = 2 * comm[0] - comm[1]          # comm doubles, compute stays
    assert np.all(compute > 0) and np.all(comm[1] > comm[0])


def test_dxkxp_rows_over_the_memory_cap_are_dropped_and_those_under_it_kept():
    prof = toy_profile("lenet")
    free = spatial_rows(search(prof, Budget(4, 1 << 40, Network(1e8), batch=16))[0])
    cap = sorted({p.memory for p in free})[len(free) // 2]
    fit = spatial_rows(search(prof, Budget(4, cap, Network(1e8), batch=16))[0])
    assert fit and all(p.memory <= cap for p in fit)
    assert {p.label() for p in free if p.memory <= cap} <= {p.label() for p in fit}
    assert len(fit) < len(free)


def test_the_dxkxp_command_is_one_psgd_train_sets_up_as_the_plan(dataset):
    """Each 4-rank --pipeline 2 --spatial 2 row's words parse, and pipeline_job's set-up (on a
    stand-in communicator of 4 ranks) accepts them with the plan's K, P, M, schedule and cut;
    `psgd train --plan auto`'s apply sets --spatial."""
    from psgd.cli import build_parser
    from psgd.plan.auto import as_dict
    from psgd.run import pipeline_job
    from psgd.run.plan_job import apply
    from psgd.tensor.pipeline import parts_of
    fit, _ = search(toy_profile("lenet"), Budget(4, 1 << 40, Network(1.25e9), batch=16))
    plans = spatial_rows(fit)
    assert plans
    comm = type("Comm", (), {"Get_size": lambda self: 4})()
    for plan in plans:
        words = command(plan, "lenet", str(dataset))
        assert words[:3] == ["mpiexec", "-n", "4"] and "--spatial" in words
        args = build_parser(words[4:]).parse_args(words[4:])
        settings, _, opts = pipeline_job._setup(args, comm)
        assert (opts.stages, parts_of(settings), settings.split.spatial, opts.microbatches, opts.schedule) == \
            (plan.stages, plan.parts, plan.parts, plan.microbatches, plan.schedule)
        assert opts.counts() == list(plan.partition) and opts.recompute
    words = ["train", "--data", str(dataset), "--model", "lenet"]
    args = build_parser(words).parse_args(words)
    apply(args, as_dict(plans[0], "lenet", str(dataset)))
    settings, _, opts = pipeline_job._setup(args, comm)
    assert (settings.split.spatial, settings.split.tensor, opts.counts()) == \
        (plans[0].parts, None, list(plans[0].partition))


@pytest.mark.mpi
def test_the_printed_dxkxp_command_trains(mpirun, dataset, tmp_path):
    """The table's --pipeline 2 --spatial 2 command for lenet, run for 2 steps on 4 ranks."""
    path = tmp_path / "p.json"
    profiles.save(toy_profile("lenet"), path)
    out = subprocess.run([sys.executable, "-m", "psgd", "plan", "--auto", "--model", "lenet", "--profile",
                          str(path), "--ranks", "4", "--memory-per-rank", "1G", "--batch", "16",
                          "--data", str(dataset), "--top", "200", "--bandwidth", "1gbit"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [l.strip() for l in out.stdout.splitlines()]
    words = shlex.split(next(l for l in lines if l.startswith("mpiexec") and "--spatial 2" in l
                             and "--pipeline 2" in l))
    assert words[:4] == ["mpiexec", "-n", "4", "psgd"]
    proc = mpirun(4, ["-m", "psgd", *words[4:], "--steps", 2, "--quiet", "--log", tmp_path / "l.jsonl"],
                  timeout=180)
    assert "psgd: pipeline of 2 stages x 2 spatial parts x 1 replica(s)" in proc.stdout, proc.stdout
