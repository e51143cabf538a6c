"""AD-PSGD simulated: the pair order's invariants (real partner draws, passive workers answer only
between computes, never before a request lands), its timing in closed form, and training along
it against a plain numpy replay of the same order."""
import argparse
import math

import numpy as np
import pytest

from psgd.data.reader import ShardReader
from psgd.gossip.adpsgd import choose, partners
from psgd.plan.cost import Job, Network
from psgd.run.settings import resolve
from psgd.simulate import adpsgd
from psgd.simulate.adpsgd import GRAD, PAIR, STEP
from psgd.simulate.command import add_arguments
from psgd.simulate.compute import compute_times
from psgd.simulate.links import Links, transfer_s
from psgd.simulate.train import build_job

LR, SEED = 0.05, 5
NET = Network(bandwidth=1e9, latency=1e-4, shm_bandwidth=math.inf)


def schedule(times, topology="ring", meets=(), n_params=1000, net=NET, seed=SEED):
    W = times.shape[0]
    job = Job(n_params, 1e-3, 1, W, 0)
    return adpsgd.simulate_pairs(times, partners(topology, W), seed, Links(job, net),
                                 adpsgd.costs(job, net), meets)


def rows_of(sch, w):
    """Worker w's rows (as either end of a pair) with their times."""
    mine = (sch.order[:, 1] == w) | ((sch.order[:, 0] == PAIR) & (sch.order[:, 2] == w))
    return sch.order[mine], sch.times[mine]


@pytest.mark.parametrize("W", [2, 3, 4, 6])
def test_each_clock_is_a_gradient_pairs_and_a_step_with_the_real_partner_draws(W):
    times = compute_times([1e-3], W, 30, seed=W, jitter="pareto:1.5", straggler=f"{W - 1}:slow=3")
    sch = schedule(times, meets=(10, 20, 30))
    near = partners("ring", W)
    assert (sch.order[:, 0] == STEP).sum() == W * 30 and np.all(np.diff(sch.times) >= 0)
    for w in range(W):
        rows, at = rows_of(sch, w)
        kinds = rows[:, 0].tolist()
        grads = [i for i, k in enumerate(kinds) if k == GRAD]
        steps = [i for i, k in enumerate(kinds) if k == STEP]
        assert rows[grads, 3].tolist() == rows[steps, 3].tolist() == list(range(30))
        for k, (g, s) in enumerate(zip(grads, steps)):   # clock k: GRAD, its pairs, STEP
            assert g < s and (k == 29 or s < grads[k + 1])
            between = rows[g + 1:s]
            assert (between[:, 0] == PAIR).all()
            if w % 2 == 0:   # an active worker: one pair, with the neighbour it draws
                assert between[:, 1:].tolist() == [[w, choose(SEED, k, w, near[w]), k]]
            else:            # a passive one answers only once its compute is over
                assert (at[g + 1:s] >= at[g] + times[w, k]).all()
                assert (between[:, 2] == w).all()
        passive_pairs = (rows[:, 0] == PAIR) & (rows[:, 2] == w)
        assert w % 2 == 0 or passive_pairs.sum() == sum(   # every request answered once
            choose(SEED, k, a, near[a]) == w for a in near[w] for k in range(30))


def test_a_pair_never_happens_before_its_request_lands():
    W, n = 4, 50_000
    times = compute_times([1e-3], W, 20, seed=1, jitter="lognormal:1")
    sch = schedule(times, n_params=n)
    x = transfer_s(Job(n, 1e-3, 1, W, 0), NET, 0, 1, 4 * n)
    for (kind, a, p, k), t in zip(sch.order.tolist(), sch.times):
        if kind == PAIR:
            rows, at = rows_of(sch, a)
            computed = at[(rows[:, 0] == GRAD) & (rows[:, 3] == k)][0] + times[a, k]
            assert t >= computed + x - 1e-15


def test_an_always_waiting_passive_answers_at_once_and_the_active_step_is_closed_form():
    c, T, n = 2e-3, 12, 1000
    times = np.array([[c] * T, [1e-9] * T])   # the passive is done at once, then waits
    sch = schedule(times, meets=(T,), n_params=n)
    x = transfer_s(Job(n, 1e-3, 1, 2, 0), NET, 0, 1, 4 * n)
    np.testing.assert_allclose(sch.ends[0], (np.arange(T) + 1) * (c + 2 * x), rtol=1e-12)
    assert sch.waits[0] == pytest.approx(T * 2 * x, rel=1e-9)


def test_a_slow_passive_paces_its_active_partner_one_answer_per_compute():
    c, slow, T, n = 1e-3, 5e-3, 20, 1000
    times = np.array([[c] * T, [slow] * T])
    sch = schedule(times, n_params=n)
    x = transfer_s(Job(n, 1e-3, 1, 2, 0), NET, 0, 1, 4 * n)
    # the active's pair k waits for the passive's compute k to end, one answer per compute
    assert (sch.ends[0] >= np.cumsum(times[1])).all()
    np.testing.assert_allclose(np.diff(sch.ends[0][2:]), slow + x, rtol=1e-9)


def test_no_worker_computes_past_a_model_average_before_all_reach_it():
    W, every, T = 4, 5, 20
    times = compute_times([1e-3], W, T, seed=3, jitter="pareto:1.2")
    sch = schedule(times, meets=range(every, T + 1, every))
    for step in range(every, T, every):
        grads = sch.times[(sch.order[:, 0] == GRAD) & (sch.order[:, 3] == step)]
        assert grads.min() >= sch.ends[:, step - 1].max()


def job_for(dataset, W: int, steps: int = 10, optimizer: str = "sgd"):
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    args = ap.parse_args(["--data", str(dataset), "--model", "mlp:784-16-10", "--batch-size", "8",
                          "--optimizer", optimizer, "--lr", str(LR), "--steps", str(steps),
                          "--protocol", "adpsgd", "--servers", "0", "--workers", str(W),
                          "--seed", str(SEED)])
    return build_job(resolve(args), W)


def replay(job, order: np.ndarray, W: int) -> np.ndarray:
    """The order read in plain numpy: a gradient at the worker's model, pairs to their mean,
    SGD steps; returns every worker's model (float32 (W, n))."""
    model, s = job.model, job.settings
    readers = [ShardReader(s.data, w, W, s.batch_size, seed=s.seed) for w in range(W)]
    X = np.repeat(model.params[None], W, axis=0)
    G = np.zeros_like(X)
    for kind, i, j, k in order.tolist():
        if kind == GRAD:
            model.params[:] = X[i]
            model.loss_and_grad(*readers[i].batch(k))
            G[i] = model.grad
        elif kind == PAIR:
            X[i] = X[j] = (X[i] + X[j]) / np.float32(2)
        else:
            X[i] = X[i] - np.float32(LR) * G[i]
    return X


@pytest.mark.parametrize("W", [2, 3, 4])
def test_training_along_the_pair_order_equals_a_numpy_replay_of_it(dataset, W):
    job = job_for(dataset, W)
    init = job.model.params.copy()
    times = compute_times([1e-3], W, job.total_steps, seed=W, jitter="pareto:1.5",
                          straggler=f"{W - 1}:slow=3")
    order = schedule(times, meets=(5, 10)).order
    got = adpsgd.train_pairs(job, order, W)
    want = replay(job_for(dataset, W), order, W)
    np.testing.assert_allclose(got["params"], want.mean(axis=0), rtol=1e-5, atol=1e-6)
    assert np.abs(got["params"] - init).max() > 100 * 1e-6   # it moved well past the tolerance
    assert got["samples"] == W * job.total_steps * 8

