"""Hogwild trained along a simulated order: lock-free reads and adds, checked against serial SGD
(one worker), a numpy replay of the same order (torn reads across shards), and asp's server;
and asp on several shards against a numpy reading of its order."""
import argparse
from dataclasses import replace

import numpy as np
import pytest

from psgd.protocols.features import CompensationOptions
from psgd.data.reader import ShardReader
from psgd.ps.order import PUSHED, REPLIED
from psgd.simulate.command import add_arguments
from psgd.simulate.compute import compute_times
from psgd.simulate.events import simulate
from psgd.simulate.links import Links
from psgd.simulate.rules import rules_for
from psgd.simulate.train import build_job, train_along
from psgd.plan.cost import Job, Network
from psgd.protocols import get
from psgd.run.settings import resolve

LR = 0.05


def job_for(dataset, protocol: str, W: int, S: int, steps: int = 12, optimizer: str = "sgd"):
    ap = argparse.ArgumentParser()
    add_arguments(ap)
    args = ap.parse_args(["--data", str(dataset), "--model", "mlp:784-16-10", "--batch-size", "8",
                          "--optimizer", optimizer, "--lr", str(LR), "--steps", str(steps),
                          "--protocol", protocol, "--servers", str(S), "--workers", str(W)])
    return build_job(resolve(args), W)


def order_of(job, W: int, S: int, steps: int, jitter: str | None = "pareto:1.5"):
    times = compute_times([np.array([2e-3])], W, steps, seed=3, jitter=jitter)
    pjob = Job(job.model.n_params, 2e-3, 8, W, S)
    net = Network(1.25e9)
    rules = rules_for(get(job.settings.protocol), None, pjob, net)
    return simulate(rules, times, S, Links(pjob, net))


def batches(job, w: int, W: int):
    s = job.settings
    return ShardReader(s.data, w, W, s.batch_size, seed=s.seed, augment=s.augment)


def test_one_hogwild_worker_is_serial_sgd(dataset):
    job = job_for(dataset, "hogwild", 1, 2)
    model, steps = job.model, job.total_steps
    init = model.params.copy()
    got = train_along(job, order_of(job, 1, 2, steps).order, 1)["params"]
    p, reader = init.copy(), batches(job, 0, 1)
    for clock in range(steps):
        model.params[:] = p
        x, y = reader.batch(clock)
        model.loss_and_grad(x, y)
        p = p + ((p - np.float32(LR) * model.grad) - p)   # the worker's delta, added
    np.testing.assert_allclose(got, p, rtol=1e-5, atol=1e-7)
    assert not np.allclose(got, init)


def replay(job, order: np.ndarray, W: int) -> np.ndarray:
    """A plain numpy reading of hogwild's rules along ``order``: a read copies a shard, an update
    adds -lr * the gradient at what the worker read (all its shards, as last read)."""
    model, smap = job.model, job.shard_map
    live = model.params.copy()
    read = np.repeat(live[None], W, axis=0)
    readers = [batches(job, w, W) for w in range(W)]
    delta = {}
    for s, kind, w, clock in order.tolist():
        part = slice(*smap.range(s))
        if kind == REPLIED:
            read[w, part] = live[part]
        elif kind == PUSHED:
            if (w, clock) not in delta:
                model.params[:] = read[w]
                x, y = readers[w].batch(clock)
                model.loss_and_grad(x, y)
                delta[(w, clock)] = (read[w] - np.float32(LR) * model.grad) - read[w]
            live[part] += delta[(w, clock)][part]
    return live


def test_hogwild_along_an_order_adds_each_update_read_where_the_order_says(dataset):
    W, S = 4, 3
    job = job_for(dataset, "hogwild", W, S)
    sch = order_of(job, W, S, job.total_steps)
    assert sch.delay[1:].sum() > 0   # updates land between a worker's read and its own
    got = train_along(job, sch.order, W)["params"]
    np.testing.assert_allclose(got, replay(job_for(dataset, "hogwild", W, S), sch.order, W),
                               rtol=1e-5, atol=1e-7)


def test_hogwild_with_sgd_is_asp_on_the_same_order(dataset):
    """asp's server steps p - lr g on arrival and answers a pull with p as it is: on one order,
    the lock-free worker's p + ((p - lr g) - p) lands on the same parameters, up to rounding."""
    W, S = 3, 2
    job = job_for(dataset, "hogwild", W, S)
    order = order_of(job, W, S, job.total_steps).order
    hog = train_along(job, order, W)["params"]
    asp = train_along(job_for(dataset, "asp", W, S), order, W)["params"]
    np.testing.assert_allclose(hog, asp, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("comp", ["inverse"])
def test_hogwild_training_refuses_compensation_in_one_line(dataset, comp):
    job = job_for(dataset, "hogwild", 2, 1)
    job.config = replace(job.config, compensation=CompensationOptions(staleness_comp=comp))
    with pytest.raises(ValueError, match="without --staleness-comp"):
        train_along(job, order_of(job, 2, 1, 4).order, 2)


def test_an_asp_push_carries_the_gradient_of_its_clock_when_the_next_reply_lands_first(dataset):
    """On several shards a reply of clock c + 1 can land on one before another takes the push
    of clock c: that push still carries the gradient at clock c's parameters (numpy reading)."""
    W, S = 8, 4
    job = job_for(dataset, "asp", W, S, steps=10)
    model, smap = job.model, job.shard_map
    init = model.params.copy()
    order = order_of(job, W, S, job.total_steps).order
    got = train_along(job, order, W)["params"]
    live, held = init.copy(), np.repeat(init[None], W, axis=0)
    readers = [batches(job, w, W) for w in range(W)]
    grads, taken, early = {}, {}, 0
    for s, kind, w, c in order.tolist():
        part = slice(*smap.range(s))
        if kind == REPLIED:
            early += c > 0 and taken.get((w, c - 1), 0) < S
            held[w, part] = live[part]
        elif kind == PUSHED:
            if (w, c) not in grads:
                model.params[:] = held[w]
                model.loss_and_grad(*readers[w].batch(c))
                grads[w, c] = model.grad.copy()
            live[part] -= np.float32(LR) * grads[w, c][part]
            taken[w, c] = taken.get((w, c), 0) + 1
    assert early > 0   # the case this checks happened
    np.testing.assert_allclose(got, live, rtol=1e-5, atol=1e-6)
