"""psgd simulate: the event loop's invariants, its links against psgd plan's cost model,
compute-time sources, and bad input in one line."""
import json
import math

import numpy as np
import pytest

from psgd.errors import PsgdError
from psgd.plan.cost import Job, Network, async_rate, bsp_step_s
from psgd.ps.order import PUSHED, REPLIED
from psgd.protocols import get
from psgd.simulate.compute import compute_times, samples_from_file
from psgd.simulate.events import Rules, simulate
from psgd.simulate.links import Links
from psgd.simulate.rules import rules_for
from psgd.simulate.stats import describe, steady_rate, tv_distance

FREE = Network(bandwidth=1e30, latency=0.0, shm_bandwidth=math.inf)


def run(protocol, times, servers=1, staleness=None, n_params=1000, net=FREE):
    W = times.shape[0]
    job = Job(n_params, 1e-3, 1, W, servers)
    return simulate(rules_for(get(protocol), staleness, job, net), times, servers, Links(job, net))


def jittery(W, T, seed=0):
    return np.random.default_rng(seed).pareto(1.5, (W, T)) * 1e-3 + 1e-4


@pytest.mark.parametrize("W,S", [(1, 1), (5, 2), (16, 3)])
def test_bsp_every_push_is_fresh(W, S):
    net = Network(bandwidth=1e8, latency=3e-5)
    sch = run("bsp", jittery(W, 30), S, net=net, n_params=50_000)
    assert sch.staleness.tolist() == [W * 30 * S]


@pytest.mark.parametrize("bound", [0, 1, 3])
def test_ssp_staleness_never_exceeds_its_bound(bound):
    times = jittery(12, 60, seed=bound)
    times[3] *= 20   # a straggler keeps the others at the bound
    sch = run("ssp", times, 2, staleness=bound)
    assert sch.staleness.size - 1 == bound   # reached, never passed
    # asp on the same times goes past it
    assert run("asp", times, 2).staleness.size - 1 > bound


def test_asp_with_equal_compute_has_w_minus_1_updates_between_read_and_push():
    W, T = 8, 40
    sch = run("asp", np.full((W, T), 1e-3))
    # the first round reads fewer updates; from then on every push is W - 1 updates late
    assert sch.delay[W - 1] == W * T - (W - 1) and sch.delay[:W - 1].sum() == W - 1
    assert sch.staleness.size <= 2   # and at most 1 clock stale


@pytest.mark.parametrize("W,c", [(4, 1e-3), (32, 2.5e-3)])
def test_bsp_throughput_with_free_links_is_w_over_c(W, c):
    sch = run("bsp", np.full((W, 50), c))
    assert sch.updates / sch.seconds == pytest.approx(W / c, rel=1e-9)


def test_the_steady_rate_leaves_out_a_late_start():
    W, c = 4, 2e-3
    times = np.full((W, 30), c)
    times[W - 1, 0] += 1.0   # one worker starts a second late (a real run's compilation)
    sch = run("bsp", times)
    assert sch.updates / sch.seconds < 0.2 * W / c
    assert steady_rate(sch) == pytest.approx(W / c, rel=1e-9)


def first_replies(sch) -> dict:
    first = {}
    for (_s, kind, _w, clock), t in zip(sch.order.tolist(), sch.times):
        if kind == REPLIED:
            first.setdefault(clock, t)
    return first


@pytest.mark.parametrize("W,shared", [(6, True), (1, False), (6, False)])
def test_a_bsp_clock_takes_what_the_plan_cost_model_predicts(W, shared):
    """Between two clocks' first replies: compute, every push, every pull, on plan's links. On
    one shared link plan schedules them transfer by transfer, as the simulator does; on a
    switch plan lets the phases follow one another, which the simulator's pulls and pushes
    overlap (one worker's push travels while the next one's reply does): then plan's clock is
    an upper bound, and compute plus the busiest link's pushes a lower one."""
    c, n = 4e-3, 200_000
    net = Network(bandwidth=1.25e8, latency=5e-5, shared=shared, shm_bandwidth=math.inf)
    job = Job(n, c, 1, W, 1)
    first = first_replies(run("bsp", np.full((W, 10), c), n_params=n, net=net))
    clock = first[5] - first[4]
    if shared or W == 1:
        assert clock == pytest.approx(bsp_step_s(job, net), rel=1e-9)
    else:
        assert c + W * 4 * n / net.bandwidth < clock < bsp_step_s(job, net)


@pytest.mark.parametrize("W", [1, 5])
def test_a_coded_bsp_clock_on_a_shared_link_takes_what_plan_predicts_for_the_codec(W):
    from psgd.plan.cost import Compression
    c, n = 4e-3, 200_000
    coding = Compression(ratio=16.0, encode_s=2e-9, decode_s=1e-9)
    net = Network(bandwidth=1.25e8, latency=5e-5, shared=True, shm_bandwidth=math.inf)
    job = Job(n, c, 1, W, 1, compression=coding)
    times = np.full((W, 10), c + coding.encode_s * job.nbytes)   # as the command encodes
    sch = simulate(rules_for(get("bsp"), None, job, net), times, 1, Links(job, net))
    first = first_replies(sch)
    assert first[5] - first[4] == pytest.approx(bsp_step_s(job, net), rel=1e-9)


def test_asp_throughput_is_near_the_plan_cost_model():
    W, c, n = 16, 5e-3, 500_000
    net = Network(bandwidth=1.25e9, latency=2e-5, shm_bandwidth=4e9)
    job = Job(n, c, 1, W, 2)
    sch = run("asp", np.full((W, 200), c), 2, n_params=n, net=net)
    assert sch.updates / sch.seconds == pytest.approx(async_rate(job, net), rel=0.15)


def test_the_simulated_order_is_a_server_order_record_can_hold():
    sch = run("ssp", jittery(4, 10), 2, staleness=1)
    for s in range(2):
        ev = sch.order[sch.order[:, 0] == s]
        assert (ev[:, 1] == PUSHED).sum() == 40 and (ev[:, 1] == REPLIED).sum() == 44
        for w in range(4):   # each worker: reply c, push c, reply c + 1, ..., done
            mine = ev[(ev[:, 2] == w)][:, 1:].tolist()
            assert mine[0] == [REPLIED, w, 0] and mine[-1][0] == 3
            assert [k for k, _, _ in mine[:-1]] == [REPLIED, PUSHED] * 10 + [REPLIED]


def test_a_straggler_spec_slows_its_worker_as_train_would():
    base = compute_times([2e-3], 4, 50, seed=1)
    slow = compute_times([2e-3], 4, 50, seed=1, straggler="2:slow=3")
    np.testing.assert_allclose(slow[2], 3 * base[2])
    np.testing.assert_array_equal(slow[[0, 1, 3]], base[[0, 1, 3]])
    paused = compute_times([2e-3], 4, 2000, seed=1, straggler="all:p=0.1,d=0.05")
    assert ((paused > 0.04).mean()) == pytest.approx(0.1, abs=0.02)


@pytest.mark.parametrize("spec", ["lognormal:0.8", "pareto:1.8"])
def test_jitter_is_heavy_tailed_with_mean_one(spec):
    t = compute_times([1.0], 100, 2000, jitter=spec)
    assert t.mean() == pytest.approx(1.0, rel=0.05) and t.max() > 5 * np.median(t)


def test_compute_times_come_from_a_timeline_or_a_log(tmp_path):
    """A timeline: per worker the gaps between its step spans (else its compute spans)."""
    steps = [{"name": "step", "ph": "X", "ts": ts, "dur": 500, "pid": p}
             for p, first in ((2, 0), (3, 1000)) for ts in (first, first + 2500, first + 7000)]
    trace = {"traceEvents": [{"name": "compute", "ph": "X", "ts": 0, "dur": d, "pid": 1}
                             for d in (1000, 3000)] + [{"name": "push", "ph": "X", "dur": 7}]
             + steps}
    (tmp_path / "t.json").write_text(json.dumps(trace))
    one, two, three = samples_from_file(str(tmp_path / "t.json"))
    np.testing.assert_allclose(one, [1e-3, 3e-3])
    # led by the median gap, plus the worker's late start (1 ms for the third)
    np.testing.assert_allclose(two, [3e-3, 2e-3, 4e-3])
    np.testing.assert_allclose(three, [4e-3, 2e-3, 4e-3])
    log = [{"kind": "step", "loss": 1.0},
           {"kind": "summary", "workers": [{"compute_s": 2.0, "steps": 100}]}]
    (tmp_path / "l.jsonl").write_text("\n".join(json.dumps(r) for r in log))
    np.testing.assert_allclose(samples_from_file(str(tmp_path / "l.jsonl"))[0], [0.02])


def test_each_worker_takes_its_own_samples_in_order_when_there_is_one_set_per_worker():
    t = compute_times([np.array([1.0, 3.0, 2.0]), np.array([7.0])], 2, 5)
    assert t[0].tolist() == [1.0, 3.0, 2.0, 1.0, 3.0] and t[1].tolist() == [7.0] * 5
    assert set(compute_times([np.array([1.0]), np.array([7.0])], 3, 100).ravel()) == {1.0, 7.0}


def test_describe_and_tv_distance():
    d = describe([1, 0, 3])
    assert d["mean"] == pytest.approx(1.5) and d["p50"] == 2 and d["max"] == 2
    assert tv_distance([1, 1], [1, 1, 0]) == 0.0 and tv_distance([1, 0], [0, 2]) == 1.0


def simulate_cli(tmp_path, *argv):
    from psgd.cli import build_parser
    from psgd.simulate.command import run as run_simulate
    argv = ["simulate", *map(str, argv)]
    run_simulate(build_parser(argv).parse_args(argv))


@pytest.mark.parametrize("argv,message", [
    (["--workers", 0], "--workers must be >= 1"),
    (["--workers", 4, "--servers", 0], "--servers must be >= 1"),
    (["--workers", 4, "--protocol", "allreduce"], "simulate models the parameter-server"),
    (["--workers", 4, "--compute-from", "PROFILE"], "not a psgd profile"),
    (["--workers", 4, "--jitter", "gauss:1"], "--jitter 'gauss:1'"),
    (["--workers", 4, "--latency-from", "PROFILE"], "not a psgd timeline"),
    (["--workers", 4, "--protocol", "asp", "--staleness", 1, "--overlap"], "drop --overlap"),
    (["--workers", 4, "--protocol", "hogwild", "--train"], "need --data"),
    (["--workers", 1, "--protocol", "adpsgd", "--servers", 0], "needs at least 2 workers"),
    (["--workers", 4, "--cores", 0], "--cores must be >= 1"),
    (["--workers", 4, "--busy-wait"], "--busy-wait needs --cores"),
    (["--workers", 4, "--cores", 2, "--protocol", "gossip", "--servers", 0], "not gossip's"),
    (["--workers", 4, "--poll", "--cores", 2], "drop --cores and --latency-from"),
    (["--workers", 4, "--poll", "--protocol", "gossip", "--servers", 0], "--poll models"),
])
def test_bad_input_is_one_line(tmp_path, argv, message):
    (tmp_path / "PROFILE").write_text('{"kind": "step"}\n')
    source = [] if "--compute-from" in argv else ["--compute-ms", 1]
    argv = [str(tmp_path / a) if a == "PROFILE" else a for a in argv]
    with pytest.raises(PsgdError) as err:
        simulate_cli(tmp_path, *source, "--model", "mlp:784-10", *argv)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_command_prints_and_writes_its_summary(tmp_path, capsys):
    simulate_cli(tmp_path, "--workers", 8, "--protocol", "ssp", "--staleness", 2, "--model",
                 "mlp:784-10", "--compute-ms", 2, "--jitter", "lognormal:1", "--steps", 50,
                 "--json", tmp_path / "s.json")
    out = json.loads((tmp_path / "s.json").read_text())
    assert out["staleness"]["max"] <= 2 and out["bsp"]["staleness"]["max"] == 0
    assert out["updates"] == 400 and "updates/s" in capsys.readouterr().out


@pytest.mark.parametrize("protocol", ["gossip", "adpsgd"])
def test_the_command_simulates_and_trains_decentralized(tmp_path, dataset, protocol):
    simulate_cli(tmp_path, "--workers", 4, "--protocol", protocol, "--servers", 0, "--model",
                 "mlp:784-10", "--compute-ms", 2, "--steps", 6, "--data", dataset, "--train",
                 "--log", tmp_path / "g.jsonl", "--eval-every", 2, "--json", tmp_path / "g.json")
    out = json.loads((tmp_path / "g.json").read_text())
    assert out["updates"] == 24 and out["staleness"]["max"] == 0 and out["servers"] == 0
    evals = [json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert [e["step"] for e in evals] == [2, 4, 6]
    assert all(0 < a["simulated_s"] < b["simulated_s"] for a, b in zip(evals, evals[1:]))


def test_the_command_overlaps_gossips_exchange_with_the_compute_between_nodes_only(tmp_path):
    from psgd.plan.cost import HIDDEN_EXCHANGE
    steps = {}
    for per_node in (1, 2):   # two workers on two nodes, then on one
        simulate_cli(tmp_path, "--workers", 2, "--protocol", "gossip", "--servers", 0, "--model",
                     "lenet", "--batch-size", 64, "--compute-ms", 12, "--steps", 20, "--bandwidth",
                     "800mbit", "--shared-link", "--shm-bandwidth", "32gbit", "--per-node",
                     per_node, "--json", tmp_path / "g.json")
        out = json.loads((tmp_path / "g.json").read_text())
        steps[per_node] = 2 / out["steady_updates_per_s"]
    exchange = 2 * 4 * 215_370 / 1e8   # LeNet's two models on one 800 Mbit/s link
    mix = (1 + 1 + 4) * 4 * 215_370 / 4e9
    hidden = min(HIDDEN_EXCHANGE * exchange, 12e-3)   # what moved while the ranks computed
    assert steps[1] == pytest.approx(12e-3 + exchange - hidden + mix, rel=0.02)   # not their sum
    copy = 4 * 215_370 / 4e9
    assert steps[2] == pytest.approx(12e-3 + copy + mix, rel=0.02)   # one node: after it


def test_measured_latencies_are_drawn_per_message_and_one_value_is_a_fixed_latency():
    W, n, lat = 6, 10_000, 3e-4
    times = jittery(W, 20, seed=4)
    job = Job(n, 1e-3, 1, W, 2)
    fixed = Network(bandwidth=1e9, latency=lat, shm_bandwidth=math.inf)
    rules = rules_for(get("asp"), None, job, fixed)
    one = simulate(rules, times, 2, Links(job, fixed))
    drawn = simulate(rules, times, 2, Links(job, fixed, latencies=[lat], seed=9))
    np.testing.assert_array_equal(one.order, drawn.order)
    np.testing.assert_array_equal(one.times, drawn.times)
    links = Links(job, Network(bandwidth=1e9, latency=0.0), latencies=[1e-3, 5e-3], seed=1)
    waits = {round(links.send(0, 3, 0.0, float(t)) - t, 9) for t in range(40)}
    assert waits == {1e-3, 5e-3}


def test_latencies_from_a_trace_are_half_of_each_pull_past_a_workers_first(tmp_path):
    from psgd.simulate.compute import latencies_from_file
    events = [{"ph": "X", "name": "pull", "pid": pid, "ts": ts, "dur": dur}
              for pid, ts, dur in [(1, 0, 900), (1, 10, 200), (1, 20, 400), (2, 0, 700),
                                   (2, 5, 600)]]
    events.append({"ph": "X", "name": "step", "pid": 1, "ts": 0, "dur": 5})
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    got = latencies_from_file(str(tmp_path / "t.json"))
    np.testing.assert_allclose(sorted(got), [100e-6, 200e-6, 300e-6])
    (tmp_path / "none.json").write_text(json.dumps({"traceEvents": events[-1:]}))
    with pytest.raises(ValueError, match="no pull spans"):
        latencies_from_file(str(tmp_path / "none.json"))


def test_a_gossip_runs_exchanges_are_its_step_spans_past_each_workers_second(tmp_path):
    from psgd.simulate.compute import latencies_from_file
    events = [{"ph": "X", "name": name, "pid": pid, "ts": ts, "dur": dur}
              for pid, name, ts, dur in [(1, "step", 0, 900), (1, "step", 10, 800),
                                         (1, "step", 20, 300), (1, "compute", 30, 50),
                                         (1, "step", 40, 700), (2, "step", 0, 600),
                                         (2, "step", 5, 600), (2, "step", 9, 250)]]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    got = latencies_from_file(str(tmp_path / "t.json"), "step")
    np.testing.assert_allclose(sorted(got), [250e-6, 300e-6, 700e-6])
    (tmp_path / "ps.json").write_text(json.dumps({"traceEvents": events[3:4]}))
    with pytest.raises(ValueError, match="no step spans"):
        latencies_from_file(str(tmp_path / "ps.json"), "step")


@pytest.mark.parametrize("flags", [["--momentum-correction", "on"],
                                   ["--compress", "topk:0.1"]])   # auto: on, with feedback
def test_training_with_the_workers_momentum_is_refused_in_one_line(tmp_path, dataset, flags):
    with pytest.raises(PsgdError) as err:
        simulate_cli(tmp_path, "--workers", 3, "--protocol", "asp", "--model", "mlp:784-10",
                     "--compute-ms", 1, "--steps", 4, "--data", dataset, "--train",
                     "--optimizer", "momentum", *flags)
    assert "not the velocity" in str(err.value) and "\n" not in str(err.value)


def test_the_measured_shm_bandwidth_is_the_one_simulated_with(tmp_path):
    argv = ["--workers", 3, "--protocol", "asp", "--model", "mlp:784-64-10", "--compute-ms", 1,
            "--steps", 20]
    simulate_cli(tmp_path, *argv, "--json", tmp_path / "m.json")
    measured = json.loads((tmp_path / "m.json").read_text())
    assert 0 < measured["shm_bandwidth"] < math.inf
    simulate_cli(tmp_path, *argv, "--shm-bandwidth", f"{measured['shm_bandwidth'] * 8!r}bit",
                 "--json", tmp_path / "g.json")
    given = json.loads((tmp_path / "g.json").read_text())
    assert given["shm_bandwidth"] == pytest.approx(measured["shm_bandwidth"], rel=1e-12)
    assert given["updates_per_s"] == pytest.approx(measured["updates_per_s"], rel=1e-9)


def test_the_shm_bandwidth_counts_an_optimizer_step_as_its_passes(monkeypatch):
    import psgd.simulate.links as links
    from psgd.plan.cost import STEP_PASSES
    clock = iter(np.arange(0.0, 100.0, 0.25e-3))   # each reading 0.25 ms after the one before
    monkeypatch.setattr(links.time, "perf_counter", lambda: next(clock))
    n = 5000
    got = links.measure_shm_bandwidth(n, "momentum", seconds=0.01)
    # the loop reads the clock once per step: each step 0.25 ms, one of STEP_PASSES passes each
    np.testing.assert_allclose(got, STEP_PASSES * 4 * n / 0.25e-3, rtol=0.05)
