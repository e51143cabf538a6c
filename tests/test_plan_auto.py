"""`psgd plan --auto`: the profile, the memory model, the cut's dynamic program, the search and
the commands it prints."""
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from psgd.errors import UsageError
from psgd.pipeline.schedules import predicted_bubble, simulate
from psgd.plan import memory, profile as profiles
from psgd.plan.auto import arithmetic, as_dict, command
from psgd.plan.cost import Network
from psgd.pipeline.partition import min_max_cut as best_cut
from psgd.plan.cut import schedule_time, stage_in_flight
from psgd.plan.inputs import model_of_spec
from psgd.plan.profile import Profile, Unit
from psgd.plan.search import Budget, search


@pytest.fixture(autouse=True)
def _short_crowd(monkeypatch):
    """The profile's crowd ratios over 10 ms of steps (subprocesses too): their values are not
    what these tests check."""
    monkeypatch.setenv("PSGD_X_CROWD_SECONDS", "0.01")
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "1")

SPEC = "mlp:20-16-12-8-4"


def toy_profile(spec=SPEC, seed=0, shape=None) -> Profile:
    """A profile of ``spec``'s real sizes (on inputs of ``shape``, 10 classes, when given) with
    random times (no timing needed)."""
    from psgd.nn.model import build_model
    model = build_model(spec, input_shape=shape, n_classes=10) if shape else model_of_spec(spec)
    rng = np.random.default_rng(seed)
    from psgd.pipeline.partition import units
    out, shape_bytes = [], lambda s: 4 * int(np.prod(s))
    for lo, hi in units(model):
        layers = model.layers[lo:hi]
        params = sum(shape_bytes(s) for la in layers for _, s in la.param_shapes())
        dense = type(layers[0]).__name__ == "Dense"
        out.append(Unit(layers[0].__class__.__name__, *rng.uniform(1e-6, 1e-5, 2),
                        shape_bytes(layers[0].in_shape), shape_bytes(layers[-1].out_shape),
                        params, params if dense else 0, layers[0].out_shape[0] if dense else 0))
    return Profile(model.spec, 8, tuple(out), 1e-10, 1000,
                   {"fp16": [2.0, 1e-10, 1e-10, True], "topk:0.01": [50.0, 1e-9, 1e-9, False]},
                   *profiles._spatial(model, units(model)),
                   input_shape=tuple(shape or ()), n_classes=10 if shape else 0)


def test_a_measured_profile_matches_the_model_and_round_trips(tmp_path):
    model = model_of_spec(SPEC)
    prof = profiles.profile_model(model, batch=4, repeats=1)
    assert sum(u.param_bytes for u in prof.units) == 4 * model.n_params
    for a, b in zip(prof.units, prof.units[1:]):
        assert a.out_bytes == b.in_bytes                  # a unit's output is the next's input
    assert prof.units[0].in_bytes == 4 * int(np.prod(model.input_shape))
    assert all(u.forward_s > 0 and u.backward_s > 0 for u in prof.units)
    assert all(type(t) is float for u in prof.units for t in (u.forward_s, u.forward_fixed_s, u.backward_s))
    assert set(prof.crowd_ratios) == {"serial"} | {f"tensor {t}" for t in prof.tensor_ratios}
    assert all(r >= 1.0 for r in prof.crowd_ratios.values()) and prof.mac_s > 0
    profiles.save(prof, tmp_path / "p.json")
    assert profiles.load(tmp_path / "p.json") == prof


def test_a_units_seconds_per_call_and_per_sample_go_through_its_two_timings():
    rng = np.random.default_rng(1)
    for _ in range(20):
        n, per_sample, per_call = int(rng.integers(1, 64)), *rng.uniform(1e-6, 1e-3, 2)
        slope, fixed = profiles._affine(per_call + n * per_sample, per_call + 2 * n * per_sample, n)
        assert (slope, fixed) == pytest.approx((per_sample, per_call))
        # the larger batch no slower than the smaller, or a negative intercept: proportional
        for small, large in [(2 * fixed, fixed), (fixed, 3 * fixed)]:
            slope, flat = profiles._affine(small, large, n)
            assert flat == 0 and slope * 2 * n == pytest.approx(large)


def test_the_profile_times_the_backward_the_model_runs(monkeypatch):
    """No input gradient up to the first layer with parameters (a rank never computes it)."""
    model = model_of_spec("mlp:12-8-6-4")
    asked = []
    for i, layer in enumerate(model.layers):
        def backward(dy, need_dx=True, _i=i, _inner=layer.backward):
            asked.append((_i, need_dx))
            return _inner(dy, need_dx)
        monkeypatch.setattr(layer, "backward", backward)
    profiles.profile_model(model, batch=4, repeats=1)
    first = min(i for i, la in enumerate(model.layers) if la.param_shapes())
    assert asked and all(need == (i > first) for i, need in asked)


def test_a_profiles_scratch_is_what_the_layers_hold_at_another_batch():
    """Input gradients, im2col columns and pooling's argmax, per unit, beyond its output."""
    from psgd.pipeline.partition import units
    model = model_of_spec("lenet")
    prof = profiles.profile_model(model, batch=4, repeats=1)
    x = np.random.default_rng(0).standard_normal((6, *model.input_shape)).astype(model.dtype)
    spans = units(model)
    _, _, acts = profiles._time_units(model, x, spans)
    held = profiles._scratch(model, spans, acts, 6)
    assert [u.scratch_at(6) for u in prof.units] == held
    assert sum(held) > 6 * sum(u.out_bytes for u in prof.units)     # more than the outputs


@pytest.mark.parametrize("text, words", [
    ("not json", "cannot read"), ('{"format": "other"}', "not a psgd profile"),
    ('{"format": "psgd-profile/6", "spec": "x", "batch": 4, "units": [], "step_s_per_byte": 0, '
     '"base_bytes": 0}', "empty"),
    ('{"format": "psgd-profile/1", "spec": "x", "batch": 4, "units": [], "step_s_per_byte": 0}',
     "not a psgd-profile/6 file"),
])
def test_a_bad_profile_is_one_line(tmp_path, text, words):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(UsageError, match=words) as err:
        profiles.load(str(path))
    assert "\n" not in str(err.value)


def test_memory_model_against_hand_computed_bytes():
    u = (Unit("a", 0, 0, 80, 64, 1000, 1000, 16), Unit("b", 0, 0, 64, 16, 200, 0, 0))
    prof = Profile("x", 1, u, 0.0, 0)
    assert memory.activations(u, 10) == 10 * (80 + 64 + 16)
    assert memory.allreduce_worker(prof, 10, 1) == 4 * 1200 + 1600      # params, grad, buf, mom
    assert memory.ps_worker(prof, 10) == 3 * 1200 + 1600
    assert memory.ps_server(prof, 3, 4, 2, 1) == (2 + 2 + 4) * 400      # ceil(1200 / 3) = 400
    # stage [a]: 3 x params + 1 slot + 2 stashed + replica buffer, 3 stored inputs, one microbatch inside
    assert memory.pipeline_stage(list(u[:1]), 5, 3, 1, 2, True) == 7 * 1000 + 3 * 5 * 80 + 5 * 64
    # T=4: 1000 split -> 250, 200 whole; activations of the split unit / 4
    assert memory.tensor_part(prof, 10, 4, 0, True) == 3 * 450 + 10 * (80 + 16 + 16)
    assert memory.tensor_part(prof, 10, 4, 0, False) == 2 * 450 + 10 * (80 + 16 + 16)  # no replicas


def _exhaustive(n, k, seconds, fits):
    best = None
    for cuts in itertools.combinations(range(1, n), k - 1):
        edges = (0, *cuts, n)
        if not all(fits(edges[s], edges[s + 1], s) for s in range(k)):
            continue
        t = max(seconds(edges[s], edges[s + 1], edges[s + 1] == n) for s in range(k))
        if best is None or t < best:
            best = t
    return best


@pytest.mark.parametrize("seed", range(30))
def test_the_cut_dp_equals_exhaustive_search(seed):
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(2, 9)), 0
    k = int(rng.integers(1, n + 1))
    cost, size, send = rng.random(n), rng.random(n), rng.random(n) * 0.3
    cap = float(rng.uniform(0.5, 3.0))

    def seconds(i, j, last):
        return cost[i:j].sum() + (0.0 if last else send[j - 1])

    def fits(i, j, s):
        return size[i:j].sum() * (1 + 0.2 * s) <= cap

    counts, want = best_cut(n, k, seconds, fits), _exhaustive(n, k, seconds, fits)
    if want is None:
        assert counts is None
        return
    edges = np.concatenate([[0], np.cumsum(counts)])
    assert len(counts) == k and min(counts) >= 1 and edges[-1] == n
    assert all(fits(edges[s], edges[s + 1], s) for s in range(k))
    got = max(seconds(edges[s], edges[s + 1], edges[s + 1] == n) for s in range(k))
    assert got == pytest.approx(want)


@pytest.mark.parametrize("k, m", [(2, 1), (3, 4), (4, 8)])
def test_schedule_time_of_equal_stages_matches_the_simulator(k, m):
    span, bubble = schedule_time([3.0] * k, m, False)
    assert bubble == pytest.approx(predicted_bubble(k, m))
    assert bubble == pytest.approx(simulate("1f1b", k, m, 1.0, 2.0)[0])
    assert span == pytest.approx((m + k - 1) * 3.0)
    assert stage_in_flight("gpipe", k, m) == (m,) * k


def test_plans_over_the_cap_are_dropped_and_the_fastest_comes_first():
    prof = toy_profile()
    loose, _ = search(prof, Budget(4, 1 << 40, Network(1.25e9), batch=8))
    cap = sorted(p.memory for p in loose)[len(loose) // 3]
    fit, smallest = search(prof, Budget(4, cap, Network(1.25e9), batch=8))
    assert fit and all(p.memory <= cap for p in fit)
    assert smallest.memory == min(p.memory for p in loose)
    rates = [p.samples_per_s for p in fit]
    assert rates == sorted(rates, reverse=True)
    kinds = {p.kind for p in loose}
    assert kinds == {"data", "pipeline", "tensor", "grid"}
    assert {p.compress for p in loose} == {"", "fp16", "topk:0.01"}
    for p in fit:
        assert p.sync == (p.staleness == 0 and not p.compress and not p.averaging)
        assert (arithmetic(p) == "= serial") == p.sync


def test_nothing_fits_names_what_the_smallest_needs():
    prof = toy_profile()
    _, smallest = search(prof, Budget(2, 1 << 40, Network(1.25e9), batch=8))
    with pytest.raises(UsageError, match=f"needs {smallest.memory} bytes") as err:
        search(prof, Budget(2, smallest.memory - 1, Network(1.25e9), batch=8))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spec", [SPEC, "lenet"])
def test_every_printed_command_parses_with_psgd_train_and_asks_for_the_plan(spec):
    from psgd.cli import build_parser
    from psgd.run.mode_flags import PipelineFlags
    from psgd import compress as codecs
    from psgd.protocols import get
    from psgd.protocols.features import CompressionOptions
    from psgd.run.tensor_rank import grid_shape
    prof = toy_profile(spec)
    fit, _ = search(prof, Budget(4, 1 << 40, Network(1.25e9), batch=8))
    assert ("spatial" in {p.kind for p in fit}) == (spec == "lenet")
    for plan in fit:
        words = command(plan, spec, "d.h5")
        assert words[:3] == ["mpiexec", "-n", "4"]
        args = build_parser(words[4:]).parse_args(words[4:])
        assert args.protocol == plan.protocol and args.batch_size == plan.batch
        opts = PipelineFlags.from_flat(vars(args)).options()
        if plan.kind == "pipeline":
            assert (opts.stages, opts.microbatches, opts.schedule) == \
                (plan.stages, plan.microbatches, plan.schedule)
            assert opts.counts() == list(plan.partition)
        else:
            assert opts is None
        if plan.kind in ("tensor", "spatial", "grid"):
            axis = "auto" if plan.kind == "grid" else plan.kind
            assert grid_shape(args, 4) == (plan.replicas, plan.parts, axis)
        assert (args.servers or 0) == plan.servers
        assert (args.compress or "") == plan.compress
        if plan.compress:       # the protocol takes the compressor (the options' own check)
            protocol = get(plan.protocol)
            protocol.check(n_servers=plan.servers, n_workers=plan.replicas)
            CompressionOptions(compress=plan.compress).check(protocol)
            codecs.check(plan.compress, 512, "auto")
        assert as_dict(plan, spec, "d.h5")["command"].startswith("mpiexec -n 4 psgd train")


def _plan_cli(*extra):
    return subprocess.run([sys.executable, "-m", "psgd", "plan", "--auto", *extra],
                          capture_output=True, text=True, timeout=120)


def test_plan_auto_cli_json_and_its_one_line_errors(tmp_path):
    path = tmp_path / "p.json"
    profiles.save(toy_profile(), path)
    base = ["--model", SPEC, "--profile", str(path), "--bandwidth", "1gbit", "--batch", "8"]
    out = _plan_cli(*base, "--ranks", "4", "--memory-per-rank", "1M", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["plans"] and data["plans_kept"] >= len(data["plans"])
    assert all(p["memory_per_rank"] <= 1 << 20 for p in data["plans"])
    for args, words in [(["--ranks", "4", "--memory-per-rank", "10"], "no plan on 4 ranks fits"),
                        (["--ranks", "4", "--memory-per-rank", "1M", "--shm-bandwidth", "fast"],
                         "--shm-bandwidth 'fast' is not a bandwidth"),
                        (["--ranks", "0", "--memory-per-rank", "1M"], "--ranks"),
                        (["--ranks", "2", "--memory-per-rank", "1M", "--model", "lenet"],
                         "is of model")]:
        bad = _plan_cli(*base, *args)
        assert bad.returncode != 0 and words in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_copies_within_a_node_are_priced_at_the_shm_bandwidth_given(tmp_path):
    """Two ranks on one node: the ring row's all-reduce is all copies, so its seconds beyond
    the compute and the optimizer step scale as 1 / --shm-bandwidth; across nodes, no change."""
    path = tmp_path / "p.json"
    profiles.save(toy_profile(), path)

    def ring_s(*flags):
        out = _plan_cli("--model", SPEC, "--profile", str(path), "--batch", "8", "--ranks", "2",
                        "--memory-per-rank", "1G", "--json", "--top", "100", "--latency-us", "0",
                        *flags)
        assert out.returncode == 0, out.stderr
        return next(p["step_s"] for p in json.loads(out.stdout)["plans"]
                    if p["plan"] == "allreduce ring W=2 S=0")
    prof = toy_profile()
    own = prof.compute_at(8) + prof.param_bytes * prof.step_s_per_byte
    slow, fast = (ring_s("--per-node", "2", "--shm-bandwidth", r) for r in ("8gbit", "32gbit"))
    assert slow - own == pytest.approx(4 * (fast - own)) and fast > own
    assert ring_s("--shm-bandwidth", "8gbit") == ring_s("--shm-bandwidth", "32gbit")


def test_an_allreduce_row_adds_the_workers_optimizer_step_and_a_server_row_does_not():
    from dataclasses import replace
    from psgd.plan.search import data_plans
    prof = toy_profile()
    budget = Budget(4, 1 << 40, Network(1.25e9), batch=8)
    (a, b) = ({p.label(): p.step_s for p in data_plans(replace(prof, step_s_per_byte=x), budget)}
              for x in (0.0, 1e-9))
    step = prof.param_bytes * 1e-9
    assert b["allreduce ring W=4 S=0"] - a["allreduce ring W=4 S=0"] == pytest.approx(step)
    assert b["allreduce hierarchical W=4 S=0"] - a["allreduce hierarchical W=4 S=0"] == pytest.approx(step)
    assert b["bsp W=3 S=1"] == a["bsp W=3 S=1"]


@pytest.mark.parametrize("spec,ranks,said", [(SPEC, 4, False), ("lenet", 2, False), ("lenet", 4, True)])
def test_the_table_holds_pipelines_of_spatial_stages_where_ranks_allow_them(tmp_path, spec, ranks, said):
    path = tmp_path / "p.json"
    profiles.save(toy_profile(spec), path)
    out = _plan_cli("--model", spec, "--profile", str(path), "--bandwidth", "1gbit", "--batch", "8",
                    "--ranks", str(ranks), "--memory-per-rank", "1G", "--top", "50")
    assert out.returncode == 0, out.stderr
    assert "not searched" not in out.stdout
    assert any("--pipeline 2 --microbatches" in line and "--spatial 2" in line
               for line in out.stdout.splitlines()) == said
    assert ("--pipeline 2 --microbatches" in out.stdout and "--tensor 2" in out.stdout) == (ranks == 4)


def test_a_stage_with_microbatches_in_flight_runs_its_forward_twice():
    from psgd.plan.cut import Stages
    prof = toy_profile()
    once, twice = Stages(prof, 4, 0.0, 0.0), Stages(prof, 4, 0.0, 0.0, rerun=True)
    n = len(prof.units)
    fw = 4 * sum(u.forward_s for u in prof.units)
    assert twice.seconds(0, n, True) - once.seconds(0, n, True) == pytest.approx(fw)


def test_every_plan_counts_the_process_base_and_its_data_slice_once():
    from dataclasses import replace
    prof, data = toy_profile(), 10_000_001
    bare, _ = search(replace(prof, base_bytes=0), Budget(4, 1 << 40, Network(1.25e9), batch=8))
    full, _ = search(prof, Budget(4, 1 << 40, Network(1.25e9), batch=8, data_bytes=data))
    state = {p.label(): p.memory for p in bare}
    assert {p.label() for p in full} == set(state)
    for p in full:
        assert p.memory - state[p.label()] == prof.base_bytes + -(-data // p.replicas), p.label()


def test_the_measured_base_does_not_grow_with_the_models_parameters(tmp_path):
    """Each profile made by `psgd plan --auto` in a process of its own, as a user makes it."""
    def base_of(spec):
        _plan_cli("--model", spec, "--ranks", "2", "--memory-per-rank", "1T", "--profile",
                  str(tmp_path / "p.json")).check_returncode()
        return profiles.load(str((tmp_path / "p.json").rename(tmp_path / f"{len(spec)}.json")))
    small, big = base_of("mlp:20-8-4"), base_of("mlp:784-2048-2048-10")     # 3 KB, 22 MB
    assert 50 << 20 < small.base_bytes < 1 << 30
    assert abs(big.base_bytes - small.base_bytes) < 0.1 * small.base_bytes


def test_the_training_split_is_counted_from_the_file(tmp_path):
    import h5py
    from conftest import write_synth
    from psgd.plan.inputs import train_bytes
    path = write_synth(tmp_path / "d.h5", n_train=300, n_test=50)
    with h5py.File(path) as f:
        want = f["train/x"][()].nbytes + f["train/y"][()].nbytes
    assert train_bytes(path) == want and train_bytes(str(tmp_path / "none.h5")) == 0


def test_the_spatial_parts_are_those_that_split_every_conv_layer():
    from psgd.pipeline.partition import units
    from psgd.tensor.spatial import SpatialWindow, height_split
    model = model_of_spec("lenet")
    count, most = profiles._spatial(model, units(model))
    assert 0 < count < len(units(model)) and most >= 2
    windows = [sum(isinstance(la, SpatialWindow) for la in height_split(model.layers, profiles._Group(p))[0])
               for p in (most, most + 1)]
    assert windows[0] == sum(type(la).__name__ in ("Conv2D", "MaxPool2D") for la in model.layers)
    assert windows[1] < windows[0]    # one more part: a layer is too thin, the rest runs whole
    assert profiles._spatial(model_of_spec(SPEC), units(model_of_spec(SPEC))) == (0, 1)


class _Recording:
    """A stand-in communicator that records each halo message's rows."""

    def __init__(self, parts, rank):
        from psgd.plan.tensor_time import Alone
        self.alone, self.sent, self.received = Alone(parts, rank), [], []

    def __getattr__(self, name):
        return getattr(self.alone, name)

    def Isend(self, buf, dest, tag):
        self.sent.append((len(buf), dest - self.alone.rank))
        return self.alone.Isend(buf, dest, tag)

    def Irecv(self, buf, source, tag):
        buf[...] = np.nan
        self.received.append((len(buf), source - self.alone.rank))
        request = self.alone.Irecv(buf, source, tag)
        assert not np.isnan(buf).any()            # the stand-in's halo rows are zeros
        return request


@pytest.mark.parametrize("parts", [2, 4])
def test_a_spatial_part_is_timed_with_the_halo_rows_a_middle_rank_exchanges(parts):
    """The timed part (rank 1 of ``parts``) posts, per window and pass, a receive and a send of
    the rows its split gives each neighbour, and its step is finite."""
    from psgd.tensor.model import TensorModel
    from psgd.tensor.spatial import SpatialWindow, split_spatial
    model = model_of_spec("lenet")
    comm = _Recording(parts, 1)
    part = TensorModel("lenet", split_spatial, comm, input_shape=model.input_shape, n_classes=model.n_classes)
    x = np.random.default_rng(0).standard_normal((4, *model.input_shape)).astype(np.float32)
    loss, _ = part.loss_and_grad(x, np.arange(4) % part.n_classes)
    assert np.isfinite(loss) and np.isfinite(part.grad).all()
    want = []
    for i, w in enumerate(part.layers):
        if not isinstance(w, SpatialWindow):
            continue
        lo, hi = w.lo, w.hi    # rank 1 receives lo[1] rows from rank 0 and hi[1] from rank 2
        rows = [(lo[1], -1), (hi[1], 1)]
        if i > part._first_param_layer:      # the backward sends back the gradients of the others' rows
            rows += [(hi[0], -1)] + ([(lo[2], 1)] if parts > 2 else [])
        want += [r for r in rows if r[0]]
    assert want and sorted(comm.received) == sorted(want)   # rows forward, their gradients back
    assert sorted(comm.sent) == sorted(comm.received)


def test_the_split_rows_compute_is_its_units_share_times_the_ratio_timed_at_its_parts(monkeypatch):
    """A spatial or tensor row's compute: the units' share at its P or T times the profile's
    ratio at that count (the widest timed count below it when not timed); at the profiled
    batch that product is the timed part's step."""
    from dataclasses import replace
    from psgd.plan import tensor_time
    from psgd.plan.search import spatial_plans, tensor_plans
    monkeypatch.setattr(tensor_time, "part_seconds", lambda model, split, parts, batch, repeats=3: 0.5 / parts)
    model = model_of_spec("lenet")
    prof = profiles.profile_model(model, batch=4, repeats=1)
    assert set(prof.spatial_ratios) == {p for p in tensor_time.TIMED if p <= prof.spatial_max}
    budget = Budget(4, 1 << 40, Network(1.25e9), batch=8)
    share = tensor_time.spatial_share(prof.units, prof.spatial_units, 8, 2)
    assert prof.spatial_ratios[2] * share == pytest.approx(0.5 / 2)
    for p in (2, 4):
        share = tensor_time.spatial_share(prof.units, prof.spatial_units, 8, p)
        rows = [spatial_plans(replace(prof, spatial_max=4, spatial_ratios=r), budget)
                for r in ({2: 1.0}, {2: 1.0, 4: 3.0})]
        one, three = (next(q for q in r if q.parts == p) for r in rows)
        assert three.step_s - one.step_s == pytest.approx(2 * share if p == 4 else 0.0)
    mlp = profiles.profile_model(model_of_spec("mlp:30-16-12-10"), batch=4, repeats=1)
    assert set(mlp.tensor_ratios) == {2, 4, 8} and mlp.tensor_ratio == mlp.tensor_ratios[2]
    rows = [tensor_plans(replace(mlp, tensor_ratios={2: 1.0, 8: r}), Budget(16, 1 << 40, Network(1.25e9), batch=8))
            for r in (1.0, 2.0)]
    by_t = [{q.parts: q.step_s for q in r} for r in rows]
    assert by_t[0][4] == by_t[1][4] and by_t[1][8] > by_t[0][8]


class _Neighbour:
    """The other stage of a 2-stage pipeline, as links: the same zero activation and gradient
    for every microbatch, nothing kept of what is sent."""

    waited = 0.0

    def __init__(self, message):
        self.message = message

    def recv_activation(self, g):
        return self.message

    recv_gradient = recv_activation

    def send_activation(self, g, x=None):
        pass

    send_gradient = release = send_activation


@pytest.mark.parametrize("schedule", ["pipedream", "pipemare"])
@pytest.mark.parametrize("s", [0, 1])
def test_a_stage_allocates_the_weight_copies_the_plan_counts(schedule, s):
    """Each stage of a 2-stage pipeline, run alone under tracemalloc (its optimizer, gradient
    and accumulator made before): the most bytes it allocates at once are the planner's
    weight copies of its slice, give or take its activations."""
    import tracemalloc
    from types import SimpleNamespace

    from psgd.nn.model import build_model
    from psgd.nn.optim import make_optimizer
    from psgd.pipeline import partition
    from psgd.pipeline.asynchronous import AsyncTrainer
    from psgd.pipeline.stage import Stage
    from psgd.plan.cut import weight_copies
    k, n, rows, width = 2, 6, 4, 1024
    model = build_model(f"mlp:32-{width}-{width}-{width}-10", seed=0, input_shape=(32,), n_classes=10)
    a, b = partition.layer_bounds(model, [2, 2])[s]
    stage = Stage(model, a, b, first=s == 0, last=s == 1, stash=schedule == "pipedream")
    optimizer = make_optimizer("sgd", stage.hi - stage.lo)
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((n, rows, 32)).astype(np.float32)
    ys = rng.integers(0, 10, (n, rows))
    grid = SimpleNamespace(stages=k, stage=s, replica=0, replicas=1)
    trainer = AsyncTrainer(stage, _Neighbour(np.zeros((rows, width), np.float32)), grid, optimizer,
                           correct=schedule == "pipemare")
    trainer.run(n, lambda g: 0.01, xs, ys)      # the kernels compiled, the layers' buffers made
    tracemalloc.start()
    trainer.run(n, lambda g: 0.01, xs, ys)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # pipemare's update average was made with the trainer; a stage with a delay writes it
    correction = trainer.correction
    held = correction.delta.nbytes if correction is not None and correction.tau else 0
    flight = stage_in_flight(schedule, k, 1)[s]
    expected = weight_copies(schedule, flight) * stage.params.nbytes
    assert abs(peak + held - expected) < 0.1 * stage.params.nbytes, (peak, held, expected, flight)

@pytest.mark.parametrize("spec", ["topk:0.01", "sign", "qsgd:4", "fp16"])
def test_the_codec_measure_encodes_as_a_worker_does(monkeypatch, spec):
    """Through the worker's encoder, with the error-feedback residual where --error-feedback
    auto keeps one (its passes are a step's work too), on the whole gradient."""
    from psgd.compress import feedback
    from psgd.plan.codec import measure_compression, residual
    seen = []
    inner = feedback.PushEncoder.encode

    def encode(self, grad):
        seen.append((self.feedback, grad.size))
        return inner(self, grad)
    monkeypatch.setattr(feedback.PushEncoder, "encode", encode)
    c = measure_compression(spec, 512, 5000, seconds=0.01)
    assert c.encode_s > 0 and c.decode_s > 0 and c.ratio > 1
    assert seen and all(s == (residual(spec) and spec != "fp16", 5000) for s in seen)


def test_a_tensor_rows_compute_is_its_units_share_times_the_measured_split_ratio():
    from dataclasses import replace
    from psgd.plan.search import tensor_plans
    from psgd.plan.tensor_time import split_ratio
    model = model_of_spec("mlp:30-16-12-10")
    prof = profiles.profile_model(model, batch=4, repeats=1)
    assert np.isfinite(prof.tensor_ratio) and prof.tensor_ratio > 0
    assert np.isfinite(split_ratio(model, prof.units, 8, repeats=1))
    budget = Budget(2, 1 << 40, Network(1.25e9), batch=8)
    (one,), (two,) = tensor_plans(replace(prof, tensor_ratios={2: 1.0}), budget), \
        tensor_plans(replace(prof, tensor_ratios={2: 2.0}), budget)
    share = sum((u.forward_at(8) + u.backward_at(8)) / (2 if u.split_bytes else 1) for u in prof.units)
    assert two.step_s - one.step_s == pytest.approx(share)


def test_the_slow_down_on_shared_cores_is_the_share_times_the_crowd_ratio_timed_for_the_step():
    """Ranks a core runs times the ratio measured for the step (the widest timed count at or
    below a row's, then the serial step's), its excess in proportion up to two a core."""
    from psgd.plan.crowd import slow_down
    ratios = {"serial": 1.1, "tensor 2": 1.2, "tensor 4": 1.4, "spatial 2": 1.3}
    assert slow_down(ratios, "tensor 4", 1.0) == 1.0
    assert slow_down(ratios, "tensor 4", 2.0) == pytest.approx(2 * 1.4)
    assert slow_down(ratios, "tensor 8", 2.0) == pytest.approx(2 * 1.4)
    assert slow_down(ratios, "tensor 2", 1.5) == pytest.approx(1.5 * 1.1)
    assert slow_down(ratios, "spatial 4", 4.0) == pytest.approx(4 * 1.3)
    assert slow_down(ratios, "serial", 2.0) == slow_down(ratios, "pipeline 3", 2.0) == pytest.approx(2.2)
    assert slow_down({}, "tensor 2", 2.0) == 2.0


def test_a_crowd_ratio_is_the_median_of_its_rounds_at_least_1(monkeypatch):
    """One round slowed by other processes (alone or crowded) does not move the ratio: the
    median of PSGD_X_CROWD_REPEATS rounds; a count below 1 is one line."""
    from psgd.errors import UsageError
    from psgd.plan import crowd
    rounds = iter([3.0, 1.2, 1.5, 0.5, 0.7, 0.9])
    monkeypatch.setattr(crowd, "_one_ratio", lambda step, seconds, n_cores: next(rounds))
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "3")
    assert crowd.crowd_ratio(lambda: None) == 1.5
    assert crowd.crowd_ratio(lambda: None) == 1.0
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "0")
    with pytest.raises(UsageError, match="PSGD_X_CROWD_REPEATS"):
        crowd.crowd_ratio(lambda: None, repeats=None)


def test_oversubscribed_rows_slow_their_compute_by_their_crowd_ratio_and_copies_by_the_share():
    """On 4 ranks of 2 cores a tensor row's compute doubles again by its measured crowd ratio;
    a data row's compute and optimizer step by the serial one; with a core each nothing changes."""
    from dataclasses import replace
    from psgd.plan.search import data_plans, tensor_plans
    prof = toy_profile("mlp:30-16-12-10")
    budget = Budget(4, 1 << 40, Network(1.25e9), batch=8, cores=2)
    crowds = [replace(prof, crowd_ratios={"serial": r, "tensor 2": r, "tensor 4": 2 * r}) for r in (1.0, 1.5)]
    (one, more) = ({p.parts: p for p in tensor_plans(c, budget)} for c in crowds)
    share = {t: tensor_time_share(prof, 8, t) for t in (2, 4)}
    assert more[2].step_s - one[2].step_s == pytest.approx(2 * 0.5 * share[2])
    assert more[4].step_s - one[4].step_s == pytest.approx(2 * 1.0 * share[4])
    (a, b) = ({p.label(): p.step_s for p in data_plans(c, budget)} for c in crowds)
    # batch x per-sample seconds, and the optimizer step, x ranks / cores
    compute = (8 * prof.compute_at(8) / 8 + prof.param_bytes * prof.step_s_per_byte) * 2
    assert b["allreduce ring W=4 S=0"] - a["allreduce ring W=4 S=0"] == pytest.approx(0.5 * compute)
    alone = Budget(2, 1 << 40, Network(1.25e9), batch=8, cores=2)
    assert [p.step_s for p in tensor_plans(crowds[0], alone)] == [p.step_s for p in tensor_plans(crowds[1], alone)]
    assert budget.crowded().net.shm_bandwidth == budget.net.shm_bandwidth / 2


def tensor_time_share(prof, batch, parts):
    from psgd.plan.tensor_time import tensor_share
    return tensor_share(prof.units, batch, parts)


def test_the_profiles_seconds_per_multiply_add_is_its_units_seconds_over_three_per_multiply_add():
    from psgd.plan.profile import macs
    model, prof = model_of_spec("lenet"), toy_profile("lenet")
    n = sum(macs(la) for la in model.layers)
    assert profiles.mac_seconds(model, prof.units) * 3 * n == pytest.approx(prof.compute_s)


@pytest.mark.parametrize("load, warned", [(5.0, True), (1.5, False)])
def test_a_profile_measured_under_load_is_warned_of_in_one_line(tmp_path, load, warned):
    """A profile taken while the load average exceeded its cores: psgd plan --auto warns on
    stderr in one line (the table still prints); an idle one's plan has no warning."""
    from dataclasses import replace
    path = tmp_path / "p.json"
    profiles.save(replace(toy_profile(), load=load, cores=2), path)
    assert profiles.load(path).load == load
    out = subprocess.run([sys.executable, "-m", "psgd", "plan", "--auto", "--model", SPEC, "--profile",
                          str(path), "--ranks", "2", "--memory-per-rank", "1G"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "allreduce" in out.stdout
    lines = [x for x in out.stderr.splitlines() if "warning" in x]
    assert len(lines) == int(warned)
    if warned:
        assert f"load average {load:.1f} on 2 cores" in lines[0] and "idle machine" in lines[0]
