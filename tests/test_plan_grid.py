"""`psgd plan --auto`'s auto-grid rows (--grid D,auto): the cut and its collectives are the
run's own choice on the same network, the compute and memory are the profile's, and a model
whose mixed cut is cheapest gets a row faster than its pure tensor and pure data rows."""
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from psgd.plan import memory
from psgd.plan.cost import Network
from psgd.plan.search import Budget, search
from test_plan_auto import toy_profile


@pytest.fixture(autouse=True)
def _short_crowd(monkeypatch):
    """The profile's crowd ratios over 10 ms of steps (subprocesses too): their values are not
    what these tests check."""
    monkeypatch.setenv("PSGD_X_CROWD_SECONDS", "0.01")
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "1")


def real_names(prof):
    """``prof`` with each unit named as a measured profile names it (its layers, lower case):
    the tensor rows read their collectives from those names."""
    from psgd.pipeline.partition import units
    from psgd.nn.model import build_model
    from psgd.plan.inputs import model_of_spec
    model = build_model(prof.spec, input_shape=prof.input_shape, n_classes=prof.n_classes) \
        if prof.input_shape else model_of_spec(prof.spec)
    names = ["+".join(type(la).__name__.lower() for la in model.layers[lo:hi]) for lo, hi in units(model)]
    return replace(prof, units=tuple(replace(u, name=n) for u, n in zip(prof.units, names)))


SPATIAL = "conv:16x3:pad1-relu-conv:16x3:pad1-relu-pool:4-flatten-dense:1024-relu-dense:10"


@pytest.mark.parametrize("spec, shape, ranks, rate, batch", [
    ("lenet", None, 2, 1e9, 8), ("lenet", None, 4, 1e8, 8), ("mlp:20-16-12-8-4", None, 4, 1e10, 8),
    (SPATIAL, (3, 64, 64), 2, 1e10, 3), (SPATIAL, (3, 64, 64), 4, 1e10, 6)])
def test_an_auto_grid_rows_head_and_cut_are_the_runs_choice_from_its_command(spec, shape, ranks, rate, batch):
    """Each grid row's head, cut and collective seconds are those `psgd train` chooses from
    the row's own command: its flags parsed by psgd train, the run's own split choice
    (psgd.run.tensor_rank's) on the layers it splits, priced by psgd.run.grid_cost with the
    --mac-ns the row passes. Big images on few samples take a spatial head on both sides."""
    from psgd.cli import build_parser
    from psgd.nn.model import model_layers
    from psgd.plan.grid import mac_seconds, split_prices
    from psgd.run.grid_cost import pricer
    from psgd.run.plan_job import network_flags
    from psgd.run.tensor_rank import _auto, grid_shape
    from test_tensor import FakeComm
    net = Network(rate / 8, 20 * 1e-6)      # as psgd plan and psgd train read --latency-us 20
    prof = replace(real_names(toy_profile(spec, shape=shape)), mac_s=3.7e-10)
    fit, _ = search(prof, Budget(ranks, 1 << 40, net, batch=batch))
    grids = [p for p in fit if p.kind == "grid"]
    assert sorted(p.parts for p in grids) == [t for t in range(2, min(ranks, batch) + 1) if ranks % t == 0]
    heads = set()
    for plan in grids:
        words = plan.train_args()
        assert words[words.index("--mac-ns") + 1] == "0.37"
        args = build_parser(["train", *words]).parse_args(["train", "--data", "d.h5", *words])
        d, t, axis = grid_shape(args, ranks)
        assert (d, t, axis) == (plan.replicas, plan.parts, "auto")
        choice = {}
        s = SimpleNamespace(batch_size=args.batch_size, split=SimpleNamespace(dtype="float32"),
                            servers=None, protocol=args.protocol)
        _auto(s, choice, d, network_flags(args))(model_layers(spec, 0, shape, 10 if shape else None)[0],
                                                  FakeComm(0, t))
        assert (plan.extra["head"], plan.extra["cut"]) == (choice["head"], choice["cut"])
        price, _ = pricer(network_flags(args), ranks, t, environ={})
        assert price.mac_s == mac_seconds(prof) == pytest.approx(3.7e-10)
        row = next(r for r in split_prices(model_layers(spec, 0, shape, 10 if shape else None)[0],
                                           FakeComm(0, t), batch, 4, price, d)
                   if (r["head"], r["cut"]) == (choice["head"], choice["cut"]))
        assert plan.extra["collective_s"] == row["collective_s"]
        spatial = " spatial" if choice["head"] == "spatial" else ""
        assert plan.label() == f"grid {d}x{t} auto{spatial} cut {choice['cut']}"
        heads.add(choice["head"])
    assert "spatial" in heads if shape else heads == {"batch"}
    if not shape:       # a part would have no sample
        assert not [p for p in search(prof, Budget(ranks, 1 << 40, net, batch=1))[0] if p.kind == "grid"]


def test_the_rows_compute_is_the_units_on_samples_at_their_share_and_the_rest_as_a_tensor_row():
    """Doubling the measured tensor ratio adds the units after the cut's tensor share once more;
    the units before it run on batch / T samples."""
    from psgd.pipeline.partition import units
    from psgd.plan.grid import grid_rows, serial_layers
    prof = real_names(toy_profile("lenet"))
    budget = Budget(2, 1 << 40, Network(1e9 / 8), batch=8)
    layers = serial_layers("lenet")
    (one,), (two,) = grid_rows(replace(prof, tensor_ratio=1.0), budget, layers), \
        grid_rows(replace(prof, tensor_ratio=2.0), budget, layers)
    starts = [lo for lo, _ in units(SimpleNamespace(layers=layers))]
    k = sum(a < one["extra"]["cut"] for a in starts)
    tail = sum((u.forward_at(8) + u.backward_at(8)) / (2 if u.split_bytes else 1) for u in prof.units[k:])
    head = sum(u.forward_at(4) + u.backward_at(4) for u in prof.units[:k])
    assert 0 < k < len(prof.units)
    assert two["step_s"] - one["step_s"] == pytest.approx(tail)
    assert one["extra"]["compute_s"] == pytest.approx(head + tail)


def test_a_rows_tensor_ratio_is_the_one_timed_at_its_t():
    """The ratio timed at a row's T is used, not the two-part one: T=2's row follows
    ``tensor_ratios[2]``, T=4's follows ``tensor_ratios[4]``."""
    from psgd.plan.grid import grid_rows, serial_layers
    prof = real_names(toy_profile("lenet"))
    budget = Budget(4, 1 << 40, Network(1e9 / 8), batch=8)
    layers = serial_layers("lenet")
    rows = {r: {row["parts"]: row["step_s"]
                for row in grid_rows(replace(prof, tensor_ratio=1.0, tensor_ratios={2: 1.0, 4: r}),
                                     budget, layers)} for r in (1.0, 2.0)}
    assert set(rows[1.0]) == {2, 4}
    assert rows[2.0][2] == rows[1.0][2]
    assert rows[2.0][4] > rows[1.0][4]


def test_an_auto_grids_memory_is_a_tensor_parts_at_cut_0_and_holds_the_head_whole():
    prof = toy_profile("lenet")
    n = len(prof.units)
    assert memory.grid_part(prof, 8, 2, 1, True, 0) == memory.tensor_part(prof, 8, 2, 1, True)
    assert memory.grid_params(prof, n, 2) == prof.param_bytes
    for k in range(n + 1):
        split = sum(u.split_bytes for u in prof.units[k:])
        assert memory.grid_params(prof, k, 2) == prof.param_bytes - split + -(-split // 2)


def test_a_model_whose_mixed_cut_is_cheapest_gets_a_grid_row_faster_than_pure_tensor_and_data():
    """lenet on 2 ranks at 100 Mbit/s: its convs on samples (small weights), its dense head
    split (large weights); in the plan's own model the grid row has more samples/s than every
    tensor and every synchronous data row on the same ranks."""
    prof = real_names(toy_profile("lenet"))
    fit, _ = search(prof, Budget(2, 1 << 40, Network(1e8 / 8), batch=32))
    (grid,) = [p for p in fit if p.kind == "grid"]
    from psgd.plan.grid import serial_layers
    assert 0 < grid.extra["cut"] < len(serial_layers("lenet"))
    rivals = [p for p in fit if p.kind == "tensor" or p.kind == "data" and p.sync]
    assert {p.kind for p in rivals} == {"tensor", "data"}
    assert all(grid.samples_per_s > p.samples_per_s for p in rivals), \
        [(p.label(), p.samples_per_s, grid.samples_per_s) for p in rivals]
    assert np.isfinite(grid.memory) and grid.memory > 0


def test_plan_auto_prints_the_grid_row_with_its_label_and_command(tmp_path):
    import json
    import subprocess
    import sys
    from psgd.plan import profile as profiles
    path = tmp_path / "p.json"
    profiles.save(real_names(toy_profile("lenet")), path)
    base = [sys.executable, "-m", "psgd", "plan", "--auto", "--model", "lenet", "--profile", str(path),
            "--ranks", "4", "--memory-per-rank", "1G", "--bandwidth", "100mbit", "--batch-size", "32",
            "--top", "100"]
    text = subprocess.run(base, capture_output=True, text=True, timeout=120, check=True).stdout
    data = json.loads(subprocess.run(base + ["--json"], capture_output=True, text=True, timeout=120,
                                     check=True).stdout)
    grids = [p for p in data["plans"] if p["kind"] == "grid"]
    assert sorted(p["parts"] for p in grids) == [2, 4]
    for p in grids:
        assert p["plan"] == f"grid {p['replicas']}x{p['parts']} auto cut {p['cut']}" and p["plan"] in text
        assert p["command"].endswith(f"--grid {p['replicas']},auto --bandwidth 0.1gbit --latency-us 20 "
                                     "--per-node 1 --mac-ns 0.1") and p["command"] in text
        assert p["step_s"] > p["collective_s"] > 0 and p["compute_s"] > 0


@pytest.mark.parametrize("spec", ["mlp:784-256-256-10", "lenet", "cifar-cnn"])
def test_cut_0_costs_what_the_tensor_rows_collectives_cost(spec):
    """The run's price of cut 0 (every layer split) is the tensor row's collectives
    (psgd/plan/tensor_comm.py), each priced by the same group price: two accounts of one
    split agree."""
    from psgd.plan.grid import group_price, serial_layers
    from psgd.plan.tensor_comm import tensor_collectives
    from psgd.plan.tensor_time import Alone
    from psgd.tensor.mixed import choose_cut
    prof, price = real_names(toy_profile(spec)), group_price(Network(1e9 / 8, 20e-6), 1, None, 2, 2)
    _, costs = choose_cut(serial_layers(spec), Alone(2), 32, 4, price)
    assert costs[0] == pytest.approx(sum(price(kind, 32 * n) for kind, n in tensor_collectives(prof.units)),
                                     rel=1e-12)


WIDE_MLP = "mlp:784-1024-1024-10"
CONV = "conv:8x3:pad1-relu-conv:8x3:pad1-relu-pool:2-flatten-dense:32-relu-dense:10"


@pytest.mark.parametrize("spec, rate, world, picked", [(WIDE_MLP, 1e8, 2, (1, 2)), (WIDE_MLP, 1e8, 4, (1, 4)),
                                                       (CONV, 1e10, 2, (2, 1)), (CONV, 1e10, 4, (4, 1))])
def test_plain_grid_auto_picks_the_grid_with_the_fewest_collective_seconds_per_sample(spec, rate, world, picked):
    """Plain --grid auto chooses D as well as T: the weight-heavy MLP on a slow link splits over
    every rank, the small-weight conv net runs pure data-parallel; the pure-data grid's cost is
    psgd plan's all-reduce of every weight over all the ranks, per sample of the D batches,
    counted here by hand, and the pick is the cheapest grid."""
    from psgd.nn.model import model_layers
    from psgd.plan.cost import Job, flat_allreduce_s
    from psgd.plan.grid import MAC_S, choose_grid, group_price
    layers = model_layers(spec, 0, (1, 28, 28), 10)[0]
    net, batch = Network(rate / 8, 20e-6), 16
    d, t, per_sample = choose_grid(layers, world, batch, 4, lambda d, t: group_price(net, 1, None, world, t))
    assert (d, t) == picked and per_sample[f"{d}x{t}"] == min(per_sample.values())
    assert set(per_sample) == {f"{world // t}x{t}" for t in (1, 2, 4) if world % t == 0}
    n = sum(int(np.prod(s)) for layer in layers for _, s in layer.param_shapes())
    data = flat_allreduce_s(Job(n, 0.0, 1, world), list(range(world)), net)
    macs = sum(int(np.prod(s)) * (la.out_shape[0] * la.out_shape[1] if len(la.out_shape) == 3 else 1)
               for la in layers for _, s in la.param_shapes())     # each weight at each output pixel
    compute = 3 * MAC_S * batch * macs        # the whole batch on each rank, forward and backward
    assert per_sample[f"{world}x1"] == pytest.approx((data + compute) / (world * batch), rel=1e-12)


def test_plain_grid_auto_takes_only_parts_that_divide_the_servers():
    """Under a parameter server the parts must divide --servers: with the parts given as [1]
    the wide MLP on a slow link gets pure data parallelism, and no allowed part is one line."""
    from psgd.nn.model import model_layers
    from psgd.plan.grid import choose_grid, group_price
    layers, net = model_layers(WIDE_MLP, 0, (1, 28, 28), 10)[0], Network(1e8 / 8, 20e-6)
    assert choose_grid(layers, 2, 16, 4, lambda d, t: group_price(net, 1, None, 2, t), [1])[:2] == (2, 1)
    with pytest.raises(ValueError, match="no grid of 2 ranks"):
        choose_grid(layers, 2, 16, 4, lambda d, t: group_price(net, 1, None, 2, t), [3])


def test_asp_and_ssp_price_part_0s_broadcast_of_the_heads_copies():
    """Under asp/ssp with servers the run's choice adds, per step, part 0's broadcast of the
    weights every part holds a copy of (the layers before the cut), an all-gather of their
    bytes; nothing at cut 0; bsp and the all-reduce protocols send none."""
    from psgd.nn.model import model_layers
    from psgd.plan.grid import group_price, split_prices
    from psgd.run.tensor_rank import shares_copies
    from test_tensor import FakeComm
    layers = model_layers(CONV, 0, (1, 28, 28), 10)[0]
    price = group_price(Network(1e9 / 8, 20e-6), 1, None, 4, 2)
    plain, shared = (split_prices(layers, FakeComm(0, 2), 16, 4, price, 2, broadcast=b) for b in (False, True))
    for a, b in zip(plain, shared):
        held = sum(int(np.prod(s)) for la in layers[:a["cut"]] for _, s in la.param_shapes())
        extra = price("all-gather", 4 * held) if a["cut"] else 0.0
        assert (a["head"], a["cut"]) == (b["head"], b["cut"])
        assert b["collective_s"] == pytest.approx(a["collective_s"] + extra, rel=1e-12)
    assert any(b["collective_s"] > a["collective_s"] for a, b in zip(plain, shared))
    flags = [("asp", 2, True), ("ssp", 2, True), ("bsp", 2, False), ("allreduce", None, False)]
    assert [shares_copies(SimpleNamespace(protocol=p, servers=n)) for p, n, _ in flags] == [w for *_, w in flags]
