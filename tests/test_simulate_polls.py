"""psgd simulate --poll: messages seen at the receiver's next poll of psgd's backoff waits."""
import math

import numpy as np
import pytest

from psgd.plan.cost import Job, Network
from psgd.ps.order import PUSHED, REPLIED
from psgd.simulate.events import Rules, simulate
from psgd.simulate.links import Links
from psgd.simulate.polls import Polls, measure

FREE = Network(bandwidth=1e30, latency=0.0, shm_bandwidth=math.inf)


def run(rules, times, polls=None):
    times = np.asarray(times, np.float64)
    job = Job(1000, 1e-3, 1, times.shape[0], 1)
    return simulate(rules, times, 1, Links(job, FREE), polls=polls)


def poll_times(p: Polls, start: float, n: int) -> np.ndarray:
    """The first ``n`` polls after the bare ones, as psgd.mpi.wait.Poller.idle sleeps."""
    out, t, sleep = [start + p.spin_s], start + p.spin_s, p.min_sleep
    for _ in range(n):
        t += sleep + p.slack
        out.append(t)
        sleep = min(sleep * p.growth, p.max_sleep)
    return np.array(out)


def test_a_message_is_seen_at_the_first_poll_after_it_lands():
    p = Polls(spin_s=3e-5, min_sleep=2e-5, growth=1.5, max_sleep=1e-3, slack=6e-5)
    polls = poll_times(p, 0.25, 200)
    for t in np.random.default_rng(0).uniform(0.25, polls[-1], 500):
        expected = t if t <= polls[0] else polls[polls >= t][0]
        assert p.seen(0.25, t) == pytest.approx(expected, abs=1e-12)


def test_polls_that_never_sleep_give_the_schedule_without_them():
    rules = Rules(bound=2, push_s=0.01)
    times = np.random.default_rng(1).pareto(2.0, (3, 20)) + 0.05
    dense = Polls(spin_s=1e9, min_sleep=1.0, growth=2.0, max_sleep=1.0, slack=0.0)
    a, b = run(rules, times), run(rules, times, dense)
    np.testing.assert_array_equal(a.order, b.order)
    np.testing.assert_allclose(a.times, b.times)


def test_an_idle_server_and_a_waiting_worker_see_messages_late():
    # By hand, one worker, computes 1.0 s, pushes 0.1 s, free links; no bare polls, sleeps
    # 0.3 s growing x2 to 0.6 s. The server idles from 0: polls at 0.3, 0.9, 1.5; the push
    # landing at 1.0 is taken at 1.5, applied at 1.6, its reply seen by the worker (waiting
    # since 1.0: polls 1.3, 1.9) at 1.9; the second push (2.9) by the server (idle since 1.6:
    # 1.9, 2.5, 3.1) at 3.1.
    p = Polls(spin_s=0.0, min_sleep=0.3, growth=2.0, max_sleep=0.6, slack=0.0)
    sch = run(Rules(bound=math.inf, push_s=0.1), np.ones((1, 2)), p)
    order = sch.order.tolist()
    pushed = [t for (_s, kind, _w, _c), t in zip(order, sch.times) if kind == PUSHED]
    replied = [t for (_s, kind, _w, _c), t in zip(order, sch.times) if kind == REPLIED]
    assert pushed == pytest.approx([1.6, 3.2])
    assert replied == pytest.approx([0.0, 1.6, 3.2])


def test_measured_polls_take_psgds_wait_constants():
    from psgd.mpi import wait
    p = measure(max_sleep=5e-4, samples=3)
    assert (p.min_sleep, p.growth, p.max_sleep) == (wait.MIN_SLEEP, wait.GROWTH, 5e-4)
    assert p.spin_s > 0 and p.slack >= 0
