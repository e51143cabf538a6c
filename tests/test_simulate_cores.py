"""psgd simulate --cores: ranks sharing fewer cores, against schedules worked out by hand."""
import json
import math

import numpy as np
import pytest

from psgd.plan.cost import Job, Network
from psgd.ps.order import DONE, PUSHED, REPLIED
from psgd.simulate.compute import compute_times, straggler_waits
from psgd.simulate.events import Rules, simulate
from psgd.simulate.links import Links

FREE = Network(bandwidth=1e30, latency=0.0, shm_bandwidth=math.inf)


def run(rules, times, cores=None, waits=None, servers=1):
    job = Job(1000, 1e-3, 1, times.shape[0], servers)
    return simulate(rules, np.asarray(times, np.float64), servers, Links(job, FREE), waits, cores)


def pushes(sch) -> list:
    """(time, worker, clock) of each push a shard applied, in order."""
    return [(round(t, 9), w, c) for (_s, kind, w, c), t in zip(sch.order.tolist(), sch.times)
            if kind == PUSHED]


def test_two_workers_and_a_server_on_one_core():
    # By hand, computes 1 s, a push's work 0.5 s, free links. Both compute from 0 at half a
    # core: 2.0. The server takes w0's push alone (2.5), then w1's while w0 computes clock 1:
    # each at half, w1's push done at 3.5 with w0 half done; w0 and w1 (clock 1) at half: w0
    # at 4.5, w1 half done; w0's push and w1's compute at half: 5.5; w1's push alone: 6.0.
    sch = run(Rules(bound=math.inf, push_s=0.5), np.ones((2, 2)), cores=(1, False))
    assert pushes(sch) == [(2.5, 0, 0), (3.5, 1, 0), (5.5, 0, 1), (6.0, 1, 1)]
    assert sch.seconds == pytest.approx(6.0)
    np.testing.assert_allclose(sch.server_busy_s, [2.0])   # work, not stretched time


def test_busy_waiting_ranks_take_their_share_all_the_time():
    # Every rank runnable (3 on 1 core): each job at a third. Computes end at 3.0; the pushes,
    # one at a time, at 4.5 and 6.0.
    sch = run(Rules(bound=math.inf, push_s=0.5), np.ones((2, 1)), cores=(1, True))
    assert pushes(sch) == [(4.5, 0, 0), (6.0, 1, 0)]


def test_a_bsp_step_is_work_the_replies_wait_for():
    # bsp (summed, a step per clock): computes at half a core (2.0), pushes 0.25 each alone
    # (2.25, 2.5), the step 0.5 alone: the replies of clock 1 go out at 3.0.
    rules = Rules(bound=0.0, summed=True, push_s=0.25, advance_s=0.5)
    sch = run(rules, np.ones((2, 1)), cores=(1, False))
    assert pushes(sch) == [(2.25, 0, 0), (2.5, 1, 0)]
    order = sch.order.tolist()
    replies = [t for (_s, kind, _w, c), t in zip(order, sch.times) if kind == REPLIED and c == 1]
    assert replies == pytest.approx([3.0, 3.0])


def test_a_stragglers_sleep_leaves_the_core_to_the_others():
    # w1 computes 1 s then sleeps 2 s. On one core: both computes end at 2.0; w1's sleep does
    # not slow w0's next compute (alone: 3.0), and w1 pushes at 4.0.
    times, waits = np.array([[1.0, 1.0], [3.0, 1.0]]), np.array([[0, 0], [2.0, 0]])
    sch = run(Rules(bound=math.inf), times, cores=(1, False), waits=waits)
    assert pushes(sch)[:3] == [(2.0, 0, 0), (3.0, 0, 1), (4.0, 1, 0)]


@pytest.mark.parametrize("bound,summed", [(math.inf, False), (0.0, True), (2.0, False)])
def test_a_core_per_rank_is_the_default_schedule(bound, summed):
    rng = np.random.default_rng(int(bound) if bound < math.inf else 7)
    times = rng.pareto(1.5, (5, 40)) * 1e-3 + 1e-4
    rules = Rules(bound=bound, summed=summed, push_s=2e-5, advance_s=3e-5 if summed else 0.0)
    plain, shared = run(rules, times, servers=2), run(rules, times, cores=(7, False), servers=2)
    assert events(shared) == events(plain)
    np.testing.assert_array_equal(shared.staleness, plain.staleness)
    assert shared.seconds == pytest.approx(plain.seconds, rel=1e-12)


def events(sch) -> list:
    """Each push and reply with its time (ns), sorted: the default loop writes a bsp step's
    replies down when the step starts, and takes a done that lands mid-push before it."""
    return sorted((round(t * 1e9), *e) for e, t in zip(sch.order.tolist(), sch.times)
                  if e[1] != DONE)


def test_fewer_cores_stretch_a_bsp_clock_by_the_ranks_per_core():
    W, c = 8, 1e-3
    alone = run(Rules(bound=0.0, summed=True), np.full((W, 20), c))
    shared = run(Rules(bound=0.0, summed=True), np.full((W, 20), c), cores=(2, False))
    assert shared.seconds == pytest.approx(alone.seconds * W / 2, rel=1e-9)


def test_straggler_waits_are_the_difference_compute_times_adds():
    base = compute_times([2e-3], 4, 30, seed=3)
    slow = compute_times([2e-3], 4, 30, seed=3, straggler="1:slow=3")
    np.testing.assert_allclose(slow - base, straggler_waits(base, 3, "1:slow=3"))


def test_the_command_shares_the_cores_it_is_given(tmp_path):
    from psgd.cli import build_parser
    from psgd.simulate.command import run as run_simulate

    def rate(*extra):
        argv = ["simulate", "--workers", "8", "--protocol", "bsp", "--model", "mlp:8-4-2",
                "--compute-ms", "2", "--steps", "20", "--latency-us", "0",
                "--shm-bandwidth", "1000gbit", "--json", str(tmp_path / "s.json"), *extra]
        run_simulate(build_parser(argv).parse_args(argv))
        out = json.loads((tmp_path / "s.json").read_text())
        return out["updates_per_s"], out["bsp"]["updates_per_s"], out["cores"]

    alone, shared = rate(), rate("--cores", "2")
    assert alone[2] is None and shared[2] == 2 and shared[1] == shared[0]
    assert shared[0] == pytest.approx(alone[0] * 2 / 8, rel=1e-3)   # 8 computes on 2 cores
