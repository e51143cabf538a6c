"""Gossip (D-PSGD) simulated: step times against `psgd plan`'s row and a straggler's reach on the
ring, exchanges drawn from a trace, training against serial SGD (one worker) and a numpy
X <- M X - lr G(X) on the graph."""
import argparse
import json

import numpy as np
import pytest

from psgd.data.reader import ShardReader
from psgd.gossip.topology import mixing_matrix
from psgd.plan.cost import Job, Network
from psgd.plan.cost import HIDDEN_EXCHANGE
from psgd.plan.rows import gossip_rows
from psgd.protocols import get
from psgd.run.settings import resolve
from psgd.simulate import gossip
from psgd.simulate.command import add_arguments
from psgd.simulate.compute import compute_times
from psgd.simulate.train import build_job

LR = 0.05


@pytest.mark.parametrize("c", [1e-3, 40e-3])   # exchange-bound, then compute-bound
def test_equal_steps_on_the_ring_take_plans_gossip_row_plus_the_overlap_mpi_does_not_give(c):
    W, T, n = 8, 5, 2_000_000
    job, net = Job(n, c / 16, 16, W, 0), Network(1.25e9)
    matrix = mixing_matrix("ring", W)
    exchange, mix = gossip.costs(matrix, job, net)
    ends = gossip.step_ends(np.full((W, T), c), matrix, exchange, mix)
    np.testing.assert_allclose(ends, np.tile(np.arange(1, T + 1) * (c + exchange + mix), (W, 1)),
                               rtol=1e-12)
    (step_s, _), = gossip_rows(job, net, "gossip").values()   # the exchange under the compute
    np.testing.assert_allclose(ends[0, -1] / T - step_s, min(HIDDEN_EXCHANGE * exchange, c), rtol=1e-9)


@pytest.mark.parametrize("c", [1e-3, 40e-3])   # exchange-bound, then compute-bound
def test_equal_steps_on_separate_nodes_take_plans_gossip_row_part_of_the_exchange_under_the_compute(c):
    W, T, n = 8, 5, 2_000_000
    job, net = Job(n, c / 16, 16, W, 0), Network(1.25e9)   # a node per worker: TCP between
    matrix = mixing_matrix("ring", W)
    exchange, mix = gossip.costs(matrix, job, net)
    ends = gossip.step_ends(np.full((W, T), c), matrix, exchange, mix, np.arange(W))
    (step_s, _), = gossip_rows(job, net, "gossip").values()
    np.testing.assert_allclose(ends, np.tile(np.arange(1, T + 1) * step_s, (W, 1)), rtol=1e-12)
    hidden = min(HIDDEN_EXCHANGE * exchange, c)      # what moved while the ranks computed
    np.testing.assert_allclose(step_s, c + exchange - hidden + mix, rtol=1e-12)
    assert max(c, exchange) + mix <= step_s < c + exchange + mix


def reference_ends(times, matrix, exchange, mix, nodes):
    """step_ends one worker and one neighbour at a time."""
    W, T = times.shape
    ends, prev = np.zeros((W, T)), np.zeros(W)
    for t in range(T):
        ready = prev + times[:, t]
        new = ready.copy()
        for i in range(W):
            for j in range(W):
                if j == i or matrix[i, j] == 0:
                    continue
                both = max(ready[i], ready[j])
                landed = both + exchange if nodes[i] == nodes[j] else \
                    max(prev[j] + exchange, both + (1 - HIDDEN_EXCHANGE) * exchange)
                new[i] = max(new[i], landed)
        prev = new + mix
        ends[:, t] = prev
    return ends


@pytest.mark.parametrize("nodes", [[0] * 6, list(range(6)), [0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1]])
def test_each_neighbours_model_lands_under_the_compute_only_from_another_node(nodes):
    W, T = 6, 12
    times = compute_times([2e-3], W, T, seed=3, jitter="lognormal:0.8")
    matrix = mixing_matrix("ring", W)
    got = gossip.step_ends(times, matrix, 1.5e-3, 1e-4, nodes)
    np.testing.assert_allclose(got, reference_ends(times, matrix, 1.5e-3, 1e-4, nodes), rtol=1e-12)
    if len(set(nodes)) == 1:   # one node: the old rule, after the neighbourhood's last compute
        np.testing.assert_allclose(got, gossip.step_ends(times, matrix, 1.5e-3, 1e-4), rtol=1e-12)


def test_a_late_worker_holds_back_the_ring_one_hop_further_each_step():
    W, c = 8, 1e-3
    times = np.full((W, 6), c)
    times[0, 0] = 1.0   # worker 0's first step takes a second
    ends = gossip.step_ends(times, mixing_matrix("ring", W), 0.0, 0.0)
    late = ends > 0.5
    for t in range(6):   # by step t the delay has reached workers within t + 1 hops of worker 0
        hops = np.minimum(np.arange(W), W - np.arange(W))
        assert (late[:, t] == (hops <= t + 1)).all()


def test_the_registry_graph_is_gossips_mixing_matrix_and_adpsgds_partners():
    np.testing.assert_array_equal(gossip.graph(get("gossip"), "ring", 4), mixing_matrix("ring", 4))
    assert gossip.graph(get("adpsgd"), "ring", 4) == [[1, 3], [0, 2], [1, 3], [0, 2]]


def job_for(dataset, W: int, topology: str, steps: int = 8):
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    args = ap.parse_args(["--data", str(dataset), "--model", "mlp:784-16-10", "--batch-size", "8",
                          "--optimizer", "sgd", "--lr", str(LR), "--steps", str(steps),
                          "--protocol", "gossip", "--servers", "0", "--workers", str(W),
                          "--topology", topology])
    return build_job(resolve(args), W)


def reference(job, matrix: np.ndarray, W: int) -> np.ndarray:
    """D-PSGD in numpy: X <- M X - lr G(X), each row's gradient on its worker's batch."""
    model, s = job.model, job.settings
    readers = [ShardReader(s.data, w, W, s.batch_size, seed=s.seed) for w in range(W)]
    X = np.repeat(model.params[None].astype(np.float64), W, axis=0)
    for clock in range(job.total_steps):
        G = np.empty_like(X)
        for w in range(W):
            model.params[:] = X[w]
            model.loss_and_grad(*readers[w].batch(clock))
            G[w] = model.grad
        X = matrix @ X - LR * G
    return X.mean(axis=0)


@pytest.mark.parametrize("W, topology", [(1, "ring"), (4, "ring"), (6, "complete")])
def test_training_mixes_and_steps_as_dpsgd(dataset, W, topology):
    job = job_for(dataset, W, topology)
    init = job.model.params.copy()
    matrix = mixing_matrix(topology, W)
    got = gossip.train_mixing(job, matrix, W)["params"]
    want = reference(job_for(dataset, W, topology), matrix, W)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert np.abs(got - init).max() > 100 * 1e-5   # it moved well past the tolerance


def test_a_deterministic_straggler_delay_holds_back_each_step_k_hops_away_from_step_k_less_1():
    W, T, c, d, slow = 8, 10, 1e-3, 0.05, 3
    times = compute_times([c], W, T, straggler=f"{slow}:p=1,d={d}")
    matrix = mixing_matrix("ring", W)
    exchange, mix = gossip.costs(matrix, Job(1000, c / 16, 16, W, 0), Network(1.25e9))
    ends = gossip.step_ends(times, matrix, exchange, mix)
    steps = np.diff(np.concatenate([np.zeros((W, 1)), ends], axis=1), axis=1)
    hops = np.minimum(np.abs(np.arange(W) - slow), W - np.abs(np.arange(W) - slow))
    for i in range(W):   # k hops away: from step k - 1 past its delays, every later step >= d
        k = max(hops[i] - 1, 0)
        assert (ends[i, k:] >= (np.arange(k, T) - k + 1) * d).all()
        assert (steps[i, k + 1:] >= d).all()
    np.testing.assert_allclose(steps[:, -1], c + d + exchange + mix, rtol=1e-9)   # its pace


def test_the_steady_rate_counts_from_the_earliest_first_step_as_a_real_timeline_is_read():
    W, T, c = 4, 6, 1e-3
    times = np.full((W, T), c)
    times[1, 0] = 0.5   # worker 1 starts late: worker 3, two hops away, waits from its step 1
    ends = gossip.step_ends(times, mixing_matrix("ring", W), 0.0, 0.0)
    assert ends[3, 0] < 2 * c and ends[3, 1] >= 0.5   # worker 3's first step ended early
    rate = gossip.summary(ends, times, 0.0)["steady_updates_per_s"]
    np.testing.assert_allclose(rate, W * (T - 1) / (ends.max() - ends[:, 0].min()), rtol=1e-12)
    assert rate < W / 0.1   # the late start's half second is inside the span it counts


def test_a_measured_exchange_is_the_mean_step_span_less_the_mix():
    spans = np.array([1e-3, 2e-3, 6e-3])
    assert gossip.measured_exchange(spans, 1e-3) == pytest.approx(spans.mean() - 1e-3, rel=1e-12)
    assert gossip.measured_exchange(spans, 1.0) == 0.0   # never below the mix it stands beside


def test_a_gossip_trace_with_equal_steps_paces_the_ring_at_compute_plus_its_step(tmp_path):
    from psgd.cli import build_parser
    from psgd.simulate.command import run as run_simulate
    step_us, W = 5000, 4
    events = [{"ph": "X", "name": "step", "pid": w, "ts": 10_000 * k, "dur": step_us}
              for w in range(W) for k in range(8)]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    argv = ["simulate", "--workers", str(W), "--protocol", "gossip", "--servers", "0",
            "--model", "mlp:784-10", "--compute-ms", "1", "--steps", "10", "--latency-from",
            str(tmp_path / "t.json"), "--json", str(tmp_path / "s.json")]
    run_simulate(build_parser(argv).parse_args(argv))
    out = json.loads((tmp_path / "s.json").read_text())
    np.testing.assert_allclose(W / out["steady_updates_per_s"], step_us * 1e-6 + 1e-3, rtol=1e-9)
