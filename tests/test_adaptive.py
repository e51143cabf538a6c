"""--staleness auto: the adaptive bound's rule on scripted events, its direction in a simulated SSP run, the bound in force under mpiexec, and its bad settings."""
import heapq
import json

import pytest

from psgd.protocols import get
from psgd.ps.adaptive import DEFAULT_START, QUIET, AdaptiveBound


def uneven_steps(a):
    """Step times 0.1 s (worker 0) and 0.3 s (worker 1), both pushed by t = 0.3."""
    for w in (0, 1):
        a.pushed(w, 0.0)
    a.pushed(0, 0.1)
    a.pushed(1, 0.3)


def window(a, needs, start):
    """One window of pulls, one every 1/3 s from ``start``, each ``need`` clocks past v = 0."""
    for i, need in enumerate(needs):
        a.pulled(clock=need, version=0, now=start + i / 3)


def test_bound_grows_by_the_longest_hold_in_fast_steps():
    a = AdaptiveBound(n_workers=2, s_max=10, window=4)
    uneven_steps(a)
    for held in (0.1, 0.4):   # 0.5 s held of 2 workers x 1 s: 25 %; the longest, 0.4 s, is 4
        a.answered(0, held)   # fast steps (the median, 2.5)
    window(a, (3, 3, 0, 1), 0)
    assert a.bound == DEFAULT_START + 4
    a.answered(0, 0.2)        # 10 % held: not enough to grow
    window(a, (6, 1, 0, 1), 1)
    assert a.history == [(0, DEFAULT_START), (0, DEFAULT_START + 4)]


def test_bound_shrinks_only_after_quiet_windows_in_a_row():
    a = AdaptiveBound(n_workers=2, s_max=10, window=4)
    uneven_steps(a)
    a.answered(0, 0.6)
    window(a, (3, 3, 0, 1), 0)
    top = a.bound                                 # 2 + 6
    for k in range(QUIET - 1):                    # the top clock unused: not yet
        window(a, (1, 2, 0, 4), 1 + k)
        assert a.bound == top
    a.pushed(1, 0.6)                              # uneven still, and the top clock needed:
    window(a, (top, 1, 0, 1), QUIET)              # the count starts again
    for k in range(QUIET - 1):
        window(a, (1, 2, 0, 4), QUIET + 1 + k)
        assert a.bound == top
    for k in range(3):                            # then one down at each quiet window
        window(a, (1, 2, 0, 4), 2 * QUIET + k)
        assert a.bound == top - 1 - k


def test_even_steps_throughout_shrink_a_lag_left_from_the_past():
    a = AdaptiveBound(n_workers=2, s_max=10, window=4)
    uneven_steps(a)
    a.answered(0, 0.6)
    window(a, (3, 3, 0, 1), 0)
    top = a.bound
    for k in range(1, 9):                         # worker 1 now steps in 0.1 s, too
        a.pushed(1, 0.3 + k / 10)
    window(a, (top,) * 4, 1)                      # uneven at the window's first pushes: kept
    for k in range(QUIET):                        # even throughout, the top clock needed
        a.pushed(1, 1.2 + k / 10)
        window(a, (top,) * 4, 2 + k)
    assert a.bound == top - 1


def test_bound_stays_within_floor_and_max():
    a = AdaptiveBound(n_workers=1, s_max=3, floor=1, window=2)
    for i in range(10):
        a.answered(0, 1.0)
        a.pulled(clock=10, version=0, now=float(i))   # always held: +1 per window
    assert a.bound == 3
    for i in range(10):
        a.pulled(clock=0, version=0, now=10.0 + i)
    assert a.bound == 1
    with pytest.raises(ValueError):
        AdaptiveBound(n_workers=1, s_max=2, floor=3)


def simulate(step_times, W, clocks=300, s_max=16, floor=None):
    """A discrete-event SSP run of W workers (the step time of worker w at clock c:
    step_times(w, c)) under an adaptive bound; returns the bound at each version reached."""
    a = AdaptiveBound(W, s_max) if floor is None else AdaptiveBound(W, s_max, floor=floor)
    pushes, pending, bounds = [0] * W, [], {}
    events = [(step_times(w, 0), w) for w in range(W)]   # (time its push arrives, worker)
    heapq.heapify(events)
    while events:
        t, w = heapq.heappop(events)
        c = pushes[w]
        pushes[w] += 1
        a.pushed(w, t)
        version = min(pushes)
        bounds[version] = a.bound
        pending.append((w, c + 1, t))
        a.pulled(c + 1, version, t)
        keep = []
        for wp, clock, since in pending:
            if version >= clock - a.bound:   # answered: it computes its next clock
                a.answered(wp, t - since)
                if clock < clocks:
                    heapq.heappush(events, (t + step_times(wp, clock), wp))
            else:
                keep.append((wp, clock, since))
        pending = keep
    return bounds


def test_bound_rises_when_one_worker_is_made_slow_and_falls_when_it_recovers():
    def times(w, c):
        return 0.3 if (w == 2 and 100 <= c < 200) else 0.1

    bounds = simulate(times, W=3)
    even = max(b for v, b in bounds.items() if v < 100)
    slow = max(b for v, b in bounds.items() if 100 <= v < 200)
    after = [b for v, b in sorted(bounds.items()) if v >= 200]
    assert even <= DEFAULT_START + 1
    assert slow == 16          # no bound ends the wait for a 3x slower worker: s_max
    assert after[-1] < slow    # it comes back down once nobody waits


def test_bound_absorbs_intermittent_pauses_and_keeps_it_between_them():
    def times(w, c):          # each worker pauses for 5 steps every 20, in turn: the other
        return 0.6 if c > 0 and c % 20 == 10 * w else 0.1   # runs 4-5 clocks past v

    bounds = simulate(times, W=2)
    settled = {b for v, b in bounds.items() if 60 <= v < 240}
    assert len(settled) == 1 and min(settled) >= 4   # one bound, no ups and downs


@pytest.mark.parametrize("floor", [0, 1, 2])
def test_bound_comes_down_to_the_floor_on_even_workers(floor):
    bounds = simulate(lambda w, c: 0.1 + 0.01 * ((w + c) % 3), W=3, floor=floor)
    assert bounds[max(bounds)] == floor
    assert max(b for v, b in bounds.items() if v > 50) == floor


def test_auto_settles_at_one_on_even_workers_not_at_a_barrier_per_clock():
    bounds = simulate(lambda w, c: 0.1 + 0.01 * ((w + c) % 3), W=3)
    assert bounds[max(bounds)] == 1 and min(bounds.values()) == 1


@pytest.mark.parametrize("servers, overlap", [(1, False), (2, False), (2, True)])
def test_no_reply_is_staler_than_the_bound_in_force(mpirun, servers, overlap):
    proc = mpirun(servers + 2, ["ps_check.py", "adaptive", "--servers", servers, "--steps", 160,
                                "--sleep", 0.01, "--base-sleep", 0.004,
                                *(["--overlap"] if overlap else [])], timeout=120)
    result = json.loads(next(line for line in proc.stdout.splitlines()
                             if line.startswith("RESULT "))[7:])
    assert result["checked"] == 2 * 159       # every reply of every worker was checked
    for history in result["histories"]:
        peak = max(range(len(history)), key=lambda i: history[i][1])
        assert history[peak][1] > DEFAULT_START and history[peak][0] < 80   # up while slow
        if not overlap:
            assert history[-1][1] < history[peak][1]                        # down after


@pytest.mark.parametrize("protocol", ["bsp", "asp"])
def test_auto_applies_to_ssp_only(protocol):
    with pytest.raises(ValueError, match=f"--staleness auto applies to --protocol ssp only, "
                                         f"not {protocol}"):
        get(protocol).check(staleness="auto")


def test_staleness_max_needs_auto_and_is_at_least_one():
    with pytest.raises(ValueError, match="--staleness-max applies to --staleness auto only"):
        get("ssp").check(staleness=3, staleness_max=8)
    with pytest.raises(ValueError, match="--staleness-max must be >= 1"):
        get("ssp").check(staleness="auto", staleness_max=0)
    assert get("ssp").check(staleness="auto", staleness_max=8) == 8.0
    assert get("ssp").check(staleness="auto") == 16.0
