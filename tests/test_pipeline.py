"""Pipeline parallelism in one process: schedules, the partitioner, options, and stages run in
threads (one model copy each) against the serial reference, bit for bit."""
import itertools
import queue
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from psgd.nn.model import build_model
from psgd.nn.optim import make_optimizer
from psgd.pipeline import partition
from psgd.pipeline.options import PipelineOptions
from psgd.run.mode_flags import PipelineFlags
from psgd.run.run_plan import refused_by
from psgd.pipeline.reference import reference_step
from psgd.pipeline.schedules import BACKWARD, FORWARD, in_flight, predicted_bubble, simulate, stage_ops
from psgd.pipeline.stage import Stage
from psgd.pipeline.trainer import PipelineTrainer

MLP = "mlp:12-16-16-16-10"
BN_CONV = "conv:6x3:pad1-bn-relu-pool:2-conv:8x3:pad1-bn-relu-gap-dense:10"
RESNET = "conv:8x3:pad1-bn-relu-res:8-res:16:s2-gap-dense:10"
SHAPE = (3, 8, 8)
BATCH = 16


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_every_microbatch_runs_forward_then_backward_once_on_every_stage(schedule):
    for k, m in itertools.product(range(1, 6), range(1, 10)):
        for s in range(k):
            ops = stage_ops(schedule, k, s, m)
            assert sorted(ops) == sorted([(FORWARD, i) for i in range(m)] + [(BACKWARD, i) for i in range(m)])
            assert all(ops.index((FORWARD, i)) < ops.index((BACKWARD, i)) for i in range(m))
            assert [i for kind, i in ops if kind == BACKWARD] == list(range(m))  # gradient order


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_simulated_bubble_equals_gpipe_formula(schedule):
    for k, m in itertools.product(range(1, 6), (1, 2, 4, 8)):
        for idle in simulate(schedule, k, m, forward=1.0, backward=2.0):
            assert idle == pytest.approx(predicted_bubble(k, m))


def test_1f1b_holds_K_minus_s_microbatches_and_gpipe_all_M():
    for k, m in itertools.product(range(1, 6), (1, 4, 8)):
        for s in range(k):
            assert in_flight("1f1b", k, s, m) == min(k - s, m)
            assert in_flight("gpipe", k, s, m) == m


def test_unknown_schedule_is_one_line():
    with pytest.raises(ValueError, match="unknown schedule 'zigzag'; choose one of gpipe, 1f1b"):
        stage_ops("zigzag", 2, 0, 4)


# -- stages in threads ----------------------------------------------------------------------
class _Links:
    """In-process links: a queue into each stage per direction, messages copied as MPI would."""

    def __init__(self, s, fwd, bwd):
        self.s, self.fwd, self.bwd, self.waited = s, fwd, bwd, 0.0

    def recv_activation(self, g):
        return self.fwd[self.s].get(timeout=60)

    def recv_gradient(self, g):
        return self.bwd[self.s].get(timeout=60)

    def send_activation(self, g, x):
        self.fwd[self.s + 1].put(x.copy())

    def send_gradient(self, g, dx):
        self.bwd[self.s - 1].put(dx.copy())

    def release(self, g):
        pass


def make(spec, dtype=np.float32):
    return build_model(spec, seed=5, dtype=dtype, input_shape=SHAPE, n_classes=10)


def data(model, steps):
    rng = np.random.default_rng(11)
    return (rng.standard_normal((steps, BATCH, *model.input_shape)).astype(model.dtype),
            rng.integers(0, 10, (steps, BATCH)))


def _run_in_threads(work, trainers):
    """``work(trainer)`` for every stage at once, one thread each; any stage's error fails the test."""
    errors = []

    def guarded(t):
        try:
            work(t)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=guarded, args=(t,)) for t in trainers]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors


def run_threads(spec, k, m, schedule, steps, opt="momentum", dtype=np.float32, keep=False):
    """K stages, each in a thread with its own model copy; the whole vector after ``steps``
    (``keep``: the stages hold their activations instead of recomputing them)."""
    models = [make(spec, dtype) for _ in range(k)]
    us = partition.units(models[0])
    counts = [len(us) // k + (i < len(us) % k) for i in range(k)]
    bounds = partition.layer_bounds(models[0], counts)
    fwd, bwd = [queue.Queue() for _ in range(k)], [queue.Queue() for _ in range(k)]
    options = PipelineOptions(stages=k, microbatches=m, schedule=schedule)
    xs, ys = data(models[0], steps)
    trainers = []
    for s, (a, b) in enumerate(bounds):
        stage = Stage(models[s], a, b, first=s == 0, last=s == k - 1, keep=keep)
        grid = SimpleNamespace(stages=k, stage=s, replica=0, replicas=1)
        trainers.append(PipelineTrainer(stage, _Links(s, fwd, bwd), grid, options,
                                        make_optimizer(opt, stage.hi - stage.lo)))

    def work(t):
        for step in range(steps):
            t.step(step, 0.05, xs[step] if t.stage.first else None,
                   ys[step] if t.stage.last else None)
    _run_in_threads(work, trainers)
    return np.concatenate([t.stage.params for t in trainers]), trainers, (xs, ys)


def serial(spec, m, steps, xs, ys, opt="momentum", dtype=np.float32):
    model = make(spec, dtype)
    o = make_optimizer(opt, model.n_params)
    for step in range(steps):
        reference_step(model, o, xs[step], ys[step], m, 0.05)
    return model.params


def check_equal(spec, k, m, schedule, steps=3, **kw):
    params, trainers, (xs, ys) = run_threads(spec, k, m, schedule, steps, **kw)
    ref = serial(spec, m, steps, xs, ys, **kw)
    assert not np.array_equal(ref, make(spec, kw.get("dtype", np.float32)).params)  # it trained
    np.testing.assert_array_equal(params, ref)
    return trainers


def _count_forwards(monkeypatch):
    """Every layer forward run in this test, by layer class (a list of names)."""
    from psgd.nn.layers import Conv2D, Dense
    calls = []
    for cls in (Dense, Conv2D):
        orig = cls.forward
        monkeypatch.setattr(cls, "forward", lambda self, x, orig=orig, name=cls.__name__: (
            calls.append(name), orig(self, x))[1])
    return calls


def _weighted_layers(spec) -> int:
    return sum(type(p).__name__ in ("Dense", "Conv2D") for layer in make(spec).layers
               for p in [layer, *getattr(layer, "parts", [])])


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("spec,k,m", [(MLP, 3, 4), (BN_CONV, 2, 8), (RESNET, 3, 4)])
def test_kept_activations_equal_serial_bit_for_bit_and_run_each_forward_once(
        monkeypatch, spec, k, m, schedule):
    calls = _count_forwards(monkeypatch)
    params, trainers, (xs, ys) = run_threads(spec, k, m, schedule, 3, keep=True)
    assert len(calls) == 3 * m * _weighted_layers(spec)   # no forward ran twice
    ref = serial(spec, m, 3, xs, ys)
    assert not np.array_equal(ref, make(spec).params)
    np.testing.assert_array_equal(params, ref)


def test_1f1b_keeps_K_minus_s_microbatches_activations_and_gpipe_M():
    k, m = 3, 8
    held = {sch: [t.stage.store.peak_bytes for t in run_threads(MLP, k, m, sch, 1, keep=True)[1]]
            for sch in ("gpipe", "1f1b")}
    for s in range(k):
        assert held["1f1b"][s] * m == held["gpipe"][s] * (k - s)


def test_recomputed_activations_run_forwards_again(monkeypatch):
    calls = _count_forwards(monkeypatch)
    run_threads(MLP, 3, 4, "1f1b", 1)
    assert len(calls) > 4 * _weighted_layers(MLP)   # stages 0 and 1 re-run their forwards


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_equals_serial_microbatch_sgd_bit_for_bit(schedule):
    check_equal(MLP, 3, 4, schedule)
    check_equal(BN_CONV, 2, 4, schedule, opt="adam")


@pytest.mark.slow
@pytest.mark.parametrize("spec,k,m,schedule", [
    (spec, k, m, sch) for spec in (MLP, BN_CONV, "resnet8", "lenet") for k in (2, 3, 4)
    for m in (1, 4, 8) for sch in ("gpipe", "1f1b")])
def test_pipeline_equals_serial_on_the_whole_matrix(spec, k, m, schedule):
    check_equal(spec, k, m, schedule, steps=50)


def test_float64_pipeline_equals_serial_and_1f1b_stores_K_minus_s_inputs():
    trainers = check_equal(MLP, 4, 8, "1f1b", dtype=np.float64, opt="sgd")
    assert [t.stage.peak_inputs for t in trainers] == [4, 3, 2, 1]
    trainers = check_equal(MLP, 4, 8, "gpipe", dtype=np.float64, opt="sgd")
    assert [t.stage.peak_inputs for t in trainers] == [8, 8, 8, 8]


# -- partition ------------------------------------------------------------------------------
def test_a_residual_block_is_one_unit_and_an_inplace_activation_stays_with_its_layer():
    model = make(RESNET)
    us = partition.units(model)
    assert sum(hi - lo for lo, hi in us) == len(model.layers)
    assert all(type(model.layers[lo]).__name__ != "ReLU" for lo, _ in us)
    assert sum(type(model.layers[lo]).__name__ == "Residual" for lo, _ in us) == 2


def random_costs(rng, n):
    return [partition.UnitCost(float(rng.uniform(0.1, 2)), int(rng.integers(1, 100)),
                               int(rng.integers(1, 100)), int(rng.integers(0, 50))) for _ in range(n)]


def compositions(n, k):
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0, *cuts, n)
        yield [b - a for a, b in zip(edges[:-1], edges[1:])]


def test_dynamic_program_finds_the_exhaustive_best_cut():
    rng = np.random.default_rng(0)
    for n, k in [(5, 2), (7, 3), (8, 4), (9, 3)]:
        costs = random_costs(rng, n)
        counts = partition.best_cut(costs, k, lambda s: 1)
        best = min(partition.slowest(costs, c) for c in compositions(n, k))
        assert partition.slowest(costs, counts) == pytest.approx(best)


def test_memory_cap_is_respected_and_one_that_no_cut_fits_is_one_line():
    rng = np.random.default_rng(1)
    costs = random_costs(rng, 8)
    bound = lambda s: 3 - s  # noqa: E731
    cap = min(max(partition.stage_memory(costs[a:a + c], bound(s))
                  for s, (a, c) in enumerate(zip(np.cumsum([0] + cc[:-1]), cc)))
              for cc in compositions(8, 3))
    counts = partition.best_cut(costs, 3, bound, memory=cap)
    edges = np.cumsum([0] + counts)
    assert all(partition.stage_memory(costs[edges[s]:edges[s + 1]], bound(s)) <= cap for s in range(3))
    with pytest.raises(ValueError, match="no cut into 3 stages fits --memory-per-rank"):
        partition.best_cut(costs, 3, bound, memory=cap - 1)


def test_cut_errors_are_one_line():
    model = make(MLP)
    with pytest.raises(ValueError, match="--pipeline 5 is more stages than model .* 4 layer units"):
        partition.check_stages(model, 5)
    with pytest.raises(ValueError, match="--partition 1,2 covers 3 layer units, but model .* has 4"):
        partition.layer_bounds(model, [1, 2])


def test_profile_gives_every_unit_its_bytes():
    model = make(BN_CONV)
    costs = partition.profile(model, 4, repeats=1)
    assert len(costs) == len(partition.units(model))
    assert sum(c.param_bytes for c in costs) == model.params.nbytes
    assert all(a.out_bytes == b.in_bytes for a, b in zip(costs, costs[1:]))


# -- options --------------------------------------------------------------------------------
@pytest.mark.parametrize("opts,batch,message", [
    (dict(stages=2, microbatches=0), 16, "--microbatches needs M >= 1, got 0"),
    (dict(stages=2, schedule="zigzag"), 16, "unknown --schedule 'zigzag'"),
    (dict(stages=2, microbatches=3), 16, "--microbatches 3 does not divide --batch-size 16"),
    (dict(stages=2, partition="3,x"), 16, "--partition must be auto or unit counts"),
    (dict(stages=3, partition="3,2"), 16, "--partition 3,2 must give 3 positive counts"),
    (dict(stages=2, memory_per_rank=0), 16, "--memory-per-rank must be positive"),
    (dict(stages=2, anneal=5), 16, "--pipemare-anneal applies to --schedule pipemare, not 1f1b"),
    (dict(stages=2, schedule="pipedream", correct=False), 16,
     "--discrepancy-correction applies to --schedule pipemare, not pipedream"),
    (dict(stages=2, schedule="pipemare", stash=False), 16,
     "--weight-stashing applies to --schedule pipedream, not pipemare"),
    (dict(stages=2, schedule="pipemare", recompute=False), 16,
     "--recompute off needs the backward on its forward's weights; pipemare runs it on newer"),
    (dict(stages=2, schedule="pipedream", stash=False, recompute=False), 16,
     "pipedream without weight stashing runs it on newer ones"),
    (dict(stages=2, schedule="1f1b", comp="inverse"), 16,
     "--stage-comp applies to --schedule pipedream or pipemare, not 1f1b"),
    (dict(stages=2, schedule="pipedream", comp="dana"), 16,
     "--stage-comp dana does not run on a pipeline stage: its look-ahead answers"),
    (dict(stages=2, schedule="pipedream", comp="nope"), 16, "--stage-comp 'nope' is not one of"),
    (dict(stages=2, schedule="pipedream", stash=False, comp="gap"), 16,
     "--stage-comp gap needs the weights each gradient was computed on: pipedream has them "
     "only with weight stashing on"),
])
def test_bad_pipeline_options_are_one_line(opts, batch, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        PipelineOptions(**opts).check(batch)


@pytest.mark.parametrize("opts,fits,recompute", [
    (dict(schedule="1f1b"), True, False),       # auto keeps activations where they fit
    (dict(schedule="gpipe"), False, True),      # ... and recomputes where only that fits
    (dict(schedule="pipedream"), True, False),  # stashing: the backward's weights are its forward's
    (dict(schedule="pipedream", stash=False), True, True),
    (dict(schedule="pipemare"), True, True),
    (dict(schedule="gpipe", recompute=True), True, True),    # given: kept as given
    (dict(schedule="gpipe", recompute=False), False, False),
])
def test_recompute_auto_keeps_activations_unless_the_schedule_or_the_cap_forbids(opts, fits,
                                                                                  recompute):
    base = PipelineOptions(stages=2, microbatches=4, **opts)
    decided = base.resolved(lambda: fits)
    assert decided.recompute is recompute
    assert decided.recomputes is recompute
    assert base.recomputes is (base.recompute if base.recompute is not None else not base.can_keep)


def test_flags_a_pipeline_does_not_run_are_refused_and_orphan_flags_too():
    given = dict(pipeline=2, compress="topk:0.01", servers=None)
    assert refused_by(PipelineFlags(), given).startswith("--compress does not work under --pipeline")
    assert "pipedream and pipemare included" in refused_by(PipelineFlags(), dict(pipeline=2, record="r"))
    assert refused_by(PipelineFlags(), dict(pipeline=2)) is None
    with pytest.raises(ValueError, match="--microbatches applies to pipeline runs; give --pipeline K"):
        PipelineFlags(microbatches=4).check_given()


# -- pipedream (asynchronous 1F1B, weight stashing) -----------------------------------------
def run_async_threads(spec, k, n, lr, stash=True, opt="momentum", keep=False, method="none",
                      **trainer):
    """Train ``n`` steps of the asynchronous pipeline (PipeDream, or PipeMare through
    ``trainer``'s anneal/correct; ``method``: --stage-comp) in one thread per stage;
    (params, bounds, xs, ys, lr)."""
    from psgd.pipeline.asynchronous import AsyncTrainer
    from psgd.pipeline.trainer import stage_comp
    models = [make(spec) for _ in range(k)]
    us = partition.units(models[0])
    bounds = partition.layer_bounds(models[0], [len(us) // k + (i < len(us) % k) for i in range(k)])
    fwd, bwd = [queue.Queue() for _ in range(k)], [queue.Queue() for _ in range(k)]
    rng = np.random.default_rng(4)
    xs = rng.standard_normal((n, 4, *models[0].input_shape)).astype(np.float32)
    ys = rng.integers(0, 10, (n, 4))
    trainers = []
    for s, (a, b) in enumerate(bounds):
        stage = Stage(models[s], a, b, first=s == 0, last=s == k - 1, stash=stash, keep=keep)
        grid = SimpleNamespace(stages=k, stage=s, replica=0, replicas=1)
        optimizer = make_optimizer(opt, stage.hi - stage.lo)
        trainers.append(AsyncTrainer(stage, _Links(s, fwd, bwd), grid, optimizer,
                                     comp=stage_comp(method, optimizer), **trainer))

    def work(t):
        t.run(n, lr, xs if t.stage.first else None, ys if t.stage.last else None)
    _run_in_threads(work, trainers)
    return np.concatenate([t.stage.params for t in trainers]), bounds, xs, ys, lr


def run_pipedream_threads(spec, k, n, stash=True, opt="momentum", vertical=False, keep=False):
    return run_async_threads(spec, k, n, lambda g: 0.05 / (1 + g), stash, opt, keep,
                             vertical=vertical)


@pytest.mark.parametrize("spec,k,vertical", [(MLP, 3, False), (BN_CONV, 2, False), (MLP, 4, False),
                                             (MLP, 4, True), (BN_CONV, 3, True)])
@pytest.mark.parametrize("keep", [False, True])
def test_pipedream_with_weight_stashing_equals_its_serial_reference_bit_for_bit(spec, k, vertical,
                                                                               keep):
    from psgd.pipeline.reference import reference_pipedream
    params, bounds, xs, ys, lr = run_pipedream_threads(spec, k, 12, vertical=vertical, keep=keep)
    ref = make(spec)
    reference_pipedream(ref, make_optimizer("momentum", ref.n_params), xs, ys, bounds, lr,
                        vertical=vertical)
    assert not np.array_equal(ref.params, make(spec).params)
    np.testing.assert_array_equal(params, ref.params)


class _JitteredLinks(_Links):
    """In-process links that sleep a random 0-2 ms before each send: another timing."""

    def __init__(self, s, fwd, bwd, rng):
        super().__init__(s, fwd, bwd)
        self.rng = rng

    def send_activation(self, g, x):
        time.sleep(self.rng.uniform(0, 2e-3))
        super().send_activation(g, x)

    def send_gradient(self, g, dx):
        time.sleep(self.rng.uniform(0, 2e-3))
        super().send_gradient(g, dx)


@pytest.mark.parametrize("trainer", [{}, {"anneal": 8, "correct": True}])
def test_an_asynchronous_run_repeats_bit_exactly_under_another_timing(monkeypatch, trainer):
    """pipedream (and pipemare) need no --record: the result does not depend on when
    messages arrive, only on the schedule's fixed op order."""
    plain = run_async_threads(MLP, 3, 12, lambda g: 0.05, **trainer)[0]
    rng = np.random.default_rng(3)
    monkeypatch.setattr(sys.modules[__name__], "_Links",
                        lambda s, fwd, bwd: _JitteredLinks(s, fwd, bwd, rng))
    jittered = run_async_threads(MLP, 3, 12, lambda g: 0.05, **trainer)[0]
    np.testing.assert_array_equal(plain, jittered)


def test_vertical_sync_differs_from_plain_pipedream():
    a = run_pipedream_threads(MLP, 3, 12)[0]
    b = run_pipedream_threads(MLP, 3, 12, vertical=True)[0]
    assert not np.array_equal(a, b)


def test_pipedream_without_stashing_runs_backwards_on_newer_weights():
    from psgd.pipeline.reference import reference_pipedream
    params, bounds, xs, ys, lr = run_pipedream_threads(MLP, 3, 12, stash=False)
    ref = make(MLP)
    reference_pipedream(ref, make_optimizer("momentum", ref.n_params), xs, ys, bounds, lr)
    assert np.isfinite(params).all() and not np.array_equal(params, ref.params)


# -- pipemare (asynchronous, one weight copy: rescheduling and discrepancy correction) -------
def run_pipemare_threads(spec, k, n, anneal, correct):
    return run_async_threads(spec, k, n, lambda g: 0.05 / (1 + 0.1 * g), stash=False, anneal=anneal,
                             correct=correct)


@pytest.mark.parametrize("spec,k,anneal,correct", [
    (MLP, 3, 6, True), (MLP, 4, None, True), (MLP, 4, 6, False), (BN_CONV, 3, 6, True),
    (MLP, 2, None, False)])
def test_pipemare_equals_its_serial_reference_bit_for_bit(spec, k, anneal, correct):
    from psgd.pipeline.reference import reference_pipemare
    params, bounds, xs, ys, lr = run_pipemare_threads(spec, k, 12, anneal, correct)
    ref = make(spec)
    reference_pipemare(ref, lambda n: make_optimizer("momentum", n), xs, ys, bounds, lr,
                       anneal=anneal, correct=correct)
    assert not np.array_equal(ref.params, make(spec).params)
    np.testing.assert_array_equal(params, ref.params)


def test_pipemare_corrections_change_the_run_and_reschedule_from_lr_over_tau():
    from psgd.pipeline.pipemare import rate
    plain = run_pipemare_threads(MLP, 3, 12, None, False)[0]
    assert not np.array_equal(plain, run_pipemare_threads(MLP, 3, 12, 6, False)[0])
    assert not np.array_equal(plain, run_pipemare_threads(MLP, 3, 12, None, True)[0])
    assert rate(4, 0, 10) == pytest.approx(1 / 4) and rate(4, 5, 10) == pytest.approx(1 / 2)
    assert rate(4, 10, 10) == rate(4, 99, 10) == rate(0, 0, 10) == 1.0


def test_discrepancy_correction_recovers_the_forwards_weights_under_steady_updates():
    from psgd.pipeline.pipemare import Correction
    c = Correction(4, 0, 3, np.float64)           # stage 0 of 4: tau = 3
    step, w = np.array([0.1, -0.2, 0.05]), np.zeros(3)
    history = [w.copy()]
    for _ in range(200):
        c.observe(w.copy(), w + step)     # observe takes over its first argument
        w = w + step
        history.append(w.copy())
    np.testing.assert_allclose(c.predict(w), history[-1 - c.tau], rtol=1e-9)
    assert Correction(4, 3, 3, np.float64).predict(w) is None   # the last stage has no delay


def test_pipemare_default_anneal_is_a_quarter_of_the_whole_run_also_when_resumed():
    """A run resumed with 5 of its 20 steps left anneals over a quarter of all 20 x M
    microbatches (T1 follows each microbatch's index in the whole run), not of the 5 left."""
    from psgd.pipeline.local import StageModel
    from psgd.pipeline.pipemare import default_anneal
    from psgd.pipeline.trainer import build_trainer
    n = len(make(MLP).layers)
    model = StageModel(MLP, 0, n, seed=5, input_shape=SHAPE, n_classes=10)
    grid = SimpleNamespace(stages=1, stage=0, p2p=None, prev=None, next=None, replicas=1, replica=0)
    opts = PipelineOptions(stages=1, microbatches=4, schedule="pipemare")
    optimizer = lambda size: make_optimizer("momentum", size)  # noqa: E731
    resumed = build_trainer(model, grid, opts, [(0, n)], optimizer, 16, 5, whole=20)
    fresh = build_trainer(model, grid, opts, [(0, n)], optimizer, 16, 20)
    assert resumed.anneal == fresh.anneal == default_anneal(20 * 4) != default_anneal(5 * 4)


# -- the cut with recomputation -------------------------------------------------------------
@pytest.mark.parametrize("schedule,m", [("1f1b", 4), ("gpipe", 4), ("1f1b", 1), ("pipedream", 8)])
def test_recomputed_forwards_are_the_backwards_that_do_not_follow_their_forward(schedule, m):
    from psgd.pipeline.schedules import recomputed
    k = 3
    for s in range(k):
        live, again = None, 0   # the microbatch the layers last ran forward
        for kind, i in stage_ops(schedule, k, s, m):
            if kind == BACKWARD:
                again += live != i
                live = None
            else:
                live = i
        assert recomputed(schedule, k, s, m) == again
    assert recomputed("1f1b", k, k - 1, m) == 0


def test_a_cut_that_counts_recomputation_moves_units_off_the_recomputing_stages():
    # six equal units, forward half of forward plus backward: with stage 0 re-running every
    # forward (3 per unit against the last stage's 2), 3,3 gives 9 and 2,4 balances (6, 8)
    costs = [partition.UnitCost(2.0, 1, 1, 1, forward=1.0) for _ in range(6)]
    shares = partition.recompute_shares("1f1b", 2, 8)
    assert shares == (1.0, 0.0)
    assert partition.best_cut(costs, 2, lambda s: 1) == [3, 3]
    counts = partition.best_cut(costs, 2, lambda s: 1, recompute=shares)
    best = min(partition.slowest(costs, c, recompute=shares) for c in compositions(6, 2))
    assert counts == [2, 4]
    assert partition.slowest(costs, counts, recompute=shares) == best


@pytest.mark.parametrize("spec", [MLP, BN_CONV, RESNET])
def test_the_auto_cut_of_a_profiled_spec_model_is_the_exhaustive_optimum(spec):
    """The dynamic program's cut over the model's own measured unit costs (with and without
    recomputation, K = 2 and 3) is as fast as the best of every contiguous cut."""
    model = make(spec)
    costs = partition.profile(model, 4, repeats=1)
    n = len(costs)
    for k in (2, 3):
        for shares in ((0.0, 0.0), partition.recompute_shares("1f1b", k, 4)):
            counts = partition.best_cut(costs, k, lambda s: 1, recompute=shares)
            best = min(partition.slowest(costs, c, recompute=shares) for c in compositions(n, k))
            assert partition.slowest(costs, counts, recompute=shares) == best


# -- psgd's staleness compensation on a stage's steps (--stage-comp) -------------------------
def reference_pipedream_compensated(model, method, xs, ys, bounds, lr):
    """PipeDream with weight stashing on one process, each stage's gradient and rate rewritten
    by its own ``method`` (psgd.ps.compensation) as a push ``K - s - 1`` updates stale that
    read the stashed weights, then stepped by the stage's own momentum optimizer."""
    from psgd.pipeline.reference import _spans
    from psgd.pipeline.schedules import versions_behind
    from psgd.pipeline.trainer import stage_comp
    spans = _spans(model, bounds)
    opts = [make_optimizer("momentum", hi - lo) for lo, hi in spans]
    comps = [stage_comp(method, opt) for opt in opts]
    history = [model.params.copy()]
    for g in range(len(xs)):
        taus = [versions_behind(len(bounds), s) for s in range(len(bounds))]
        reads = [history[max(0, g - tau)][lo:hi].copy() for (lo, hi), tau in zip(spans, taus)]
        for (lo, hi), read in zip(spans, reads):
            model.params[lo:hi] = read
        model.loss_and_grad(xs[g], ys[g])
        latest = history[-1].copy()
        for (lo, hi), tau, read, comp, opt in zip(spans, taus, reads, comps, opts):
            grad, rate = comp.adjust(model.grad[lo:hi].copy(), lr(g), tau, tau, latest[lo:hi], read)
            opt.step(latest[lo:hi], grad, rate)
        history.append(latest)
    model.params[:] = history[-1]


@pytest.mark.parametrize("method,k", [("dcasgd", 3), ("gap", 2), ("inverse", 4), ("amom", 3)])
def test_stage_comp_equals_serial_pipedream_with_each_stage_compensated(method, k):
    plain, bounds, xs, ys, lr = run_async_threads(MLP, k, 12, lambda g: 0.05)
    params = run_async_threads(MLP, k, 12, lambda g: 0.05, method=method)[0]
    ref = make(MLP)
    reference_pipedream_compensated(ref, method, xs, ys, bounds, lr)
    assert not np.array_equal(params, plain)
    np.testing.assert_array_equal(params, ref.params)


def test_stage_comp_on_pipemare_reads_the_corrections_estimate():
    """dcasgd on pipemare corrects from the weights the backward ran on (the estimate): with
    the correction on it changes the run, and without it the flag is refused."""
    base = run_async_threads(MLP, 3, 12, lambda g: 0.05, stash=False, anneal=None, correct=True)[0]
    comp = run_async_threads(MLP, 3, 12, lambda g: 0.05, stash=False, anneal=None, correct=True,
                             method="dcasgd")[0]
    assert np.isfinite(comp).all() and not np.array_equal(base, comp)
    with pytest.raises(ValueError, match="--stage-comp dcasgd needs the weights .* discrepancy"):
        PipelineOptions(2, 4, "pipemare", correct=False, comp="dcasgd").check(32)


class _Node:
    """A stand-in communicator whose node holds ``ranks`` ranks."""

    def __init__(self, ranks):
        self.ranks = ranks

    def Split_type(self, kind):
        return self

    def Get_size(self):
        return self.ranks

    def Free(self):
        pass


@pytest.mark.parametrize("ranks,cores,spins", [(2, 2, True), (1, 4, True), (4, 2, False),
                                               (3, 2, False)])
def test_a_wait_on_a_neighbour_spins_only_where_every_rank_of_the_node_has_a_core(
        monkeypatch, ranks, cores, spins):
    from psgd.pipeline import transport
    monkeypatch.setattr(transport.os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert transport.spin_seconds(_Node(ranks)) == (transport.SPIN_S if spins else 0.0)
    assert transport.SPIN_S > 0
