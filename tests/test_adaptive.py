"""--staleness auto: the adaptive bound's rule on scripted events, its direction in a simulated SSP run, the bound in force under mpiexec, and its bad settings."""
import heapq
import json

import pytest

from psgd.protocols import get
from psgd.ps.adaptive import DEFAULT_START, AdaptiveBound


def test_bound_grows_by_the_median_hold_in_fast_steps_and_shrinks_when_unused():
    a = AdaptiveBound(n_workers=2, s_max=10, window=4)
    assert a.bound == DEFAULT_START
    for w in (0, 1):          # step times: 0.1 s (worker 0), 0.3 s (worker 1): uneven
        a.pushed(w, 0.0)
    a.pushed(0, 0.1)
    a.pushed(1, 0.3)
    for held in (0.3, 0.3):   # 0.6 s held of 2 workers x 1 s: 30 %; 0.3 s = 3 fast steps
        a.answered(0, held)
    for i, need in enumerate((3, 3, 0, 1)):
        a.pulled(clock=need, version=0, now=i / 3)
    assert a.bound == DEFAULT_START + 3
    for i, need in enumerate((1, 2, 0, 4)):     # top clock (5) unused: one down
        a.pulled(clock=need, version=0, now=1 + i / 3)
    assert a.bound == DEFAULT_START + 2
    a.answered(0, 0.2)                          # 10 % held: not enough to grow
    for i, need in enumerate((4, 1, 0, 1)):     # top clock used: kept
        a.pulled(clock=need, version=0, now=2 + i / 3)
    assert a.bound == DEFAULT_START + 2
    for k in range(1, 9):                       # worker 1 now steps in 0.1 s, too: even
        a.pushed(1, 0.3 + k / 10)
    for i, need in enumerate((4, 1, 0, 1)):     # the lag is the past's: one down
        a.pulled(clock=need, version=0, now=3 + i / 3)
    assert a.bound == DEFAULT_START + 1
    assert a.history == [(0, 2), (0, 5), (0, 4), (0, 3)]


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


def simulate(step_times, W, clocks=300, s_max=16):
    """A discrete-event SSP run of W workers (the step time of worker w at clock c:
    step_times(w, c)) under an adaptive bound; returns the bound at each version reached."""
    a = AdaptiveBound(W, s_max)
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


@pytest.mark.parametrize("servers, overlap", [(1, False), (2, False), (2, True)])
def test_no_reply_is_staler_than_the_bound_in_force(mpirun, servers, overlap):
    proc = mpirun(servers + 2, ["ps_check.py", "adaptive", "--servers", servers, "--steps", 160,
                                "--sleep", 0.01, *(["--overlap"] if overlap else [])], timeout=120)
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
