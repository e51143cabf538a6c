"""The bsp server's sum of pushes: a step on two gradients at once, and checks that name the bad push."""
import numpy as np
import pytest

from psgd.errors import NonFinitePush
from psgd.nn.optim import make_optimizer
from psgd.protocols.features import make_config
from psgd.ps.bsp import BspUpdate
from psgd.ps.versions import ShardVersions, step_into

NAMES = ["sgd", "momentum", "nesterov", "adam"]


def _grads(n_grads, n=1001, seed=5):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(n).astype(np.float32) for _ in range(n_grads)]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("into", [False, True], ids=["in-place", "into"])
def test_a_step_on_two_gradients_equals_the_step_on_their_float32_sum(name, into):
    init, g1, g2 = _grads(3)
    ref, fused = (make_optimizer(name, init.size, weight_decay=0.01) for _ in range(2))
    want, have = init.copy(), init.copy()
    keep = g1.copy(), g2.copy()
    for _ in range(3):
        assert ref.step(want, g1 + g2, 0.05, scale=0.5, check=True)
        if into:
            dst = np.empty_like(have)
            assert step_into(fused, have, g1, dst, 0.05, scale=0.5, grad2=g2)
            fused.steps += 1
            have = dst
        else:
            assert fused.step(have, g1, 0.05, scale=0.5, check=True, grad2=g2)
    np.testing.assert_array_equal(have, want)
    for key in ref.state_keys:
        np.testing.assert_array_equal(getattr(fused, key), getattr(ref, key))
    for g, before in zip((g1, g2), keep):   # neither gradient is written
        np.testing.assert_array_equal(g, before)


@pytest.mark.parametrize("name", NAMES)
def test_the_check_of_a_step_on_two_gradients_sees_nan_in_either_and_an_overflowing_sum(name):
    n = 64
    big = np.full(n, 2e38, np.float32)             # each finite, the sum is not
    assert make_optimizer(name, n).step(np.zeros(n, np.float32), big, 1e-40, check=True)
    assert not make_optimizer(name, n).step(np.zeros(n, np.float32), big, 1e-40, check=True,
                                            grad2=big)
    for which in range(2):
        gs = [np.ones(n, np.float32), np.ones(n, np.float32)]
        gs[which][17] = np.nan
        assert not make_optimizer(name, n).step(np.zeros(n, np.float32), gs[0], 0.1,
                                                check=True, grad2=gs[1])
        assert not step_into(make_optimizer(name, n), np.zeros(n, np.float32), gs[0],
                             np.empty(n, np.float32), 0.1, grad2=gs[1])


def _rule(skip=False, name="sgd", n=1001):
    config = make_config("bsp", n, lr_schedule=lambda c: 0.5, skip_nonfinite=skip)
    versions = ShardVersions(np.ones(n, np.float32))
    return BspUpdate(config, make_optimizer(name, n, weight_decay=0.01), versions), versions


# how the pushes of a clock reach the rule: all received into its buffer (messages), all
# lent from the workers' push window, or alternating (workers on and off the node)
HOW = ["messages", "window", "mixed"]


def _lent(how, w):
    return how == "window" or (how == "mixed" and w % 2 == 1)


def _push(rule, g, source, clock=0, lent=False):
    if lent:   # read in place; the rule must never write it
        return rule.push(g, clock, 0, source, borrowed=True)
    buf = rule.receive_buffer()
    buf[:] = g
    return rule.push(buf, clock, 0, source)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("skip", [False, True], ids=["deferred-checks", "skip-nonfinite"])
@pytest.mark.parametrize("count", [1, 2, 3, 4])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_bsp_rule_steps_with_the_mean_of_the_clocks_pushes_summed_in_arrival_order(skip, count,
                                                                                  name, how):
    grads = _grads(count)
    keep = [g.copy() for g in grads]
    rule, versions = _rule(skip, name)
    ref = make_optimizer(name, grads[0].size, weight_decay=0.01)
    want = np.ones_like(grads[0])
    for clock in range(2):                     # two clocks: the buffers are reused
        total = grads[0].copy()
        for g in grads[1:]:
            total = total + g
        assert ref.step(want, total, 0.5, scale=1.0 / count)
        for w, g in enumerate(grads):
            assert _push(rule, g, 10 + w, clock, _lent(how, w))
        assert rule.advance(clock, clock + 1)
        np.testing.assert_array_equal(versions.live, want)
    assert rule.n_updates == 2
    for g, before in zip(grads, keep):   # a lent push is never written
        np.testing.assert_array_equal(g, before)


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("bad_at", [0, 1, 2])
@pytest.mark.parametrize("idle", [True, False], ids=["idle-between-pushes", "busy"])
def test_bsp_rule_names_the_worker_whose_push_held_nan(bad_at, idle, how):
    rule, _ = _rule()
    grads = _grads(3)
    grads[bad_at][500] = np.nan
    taken = []
    with pytest.raises(NonFinitePush) as err:
        for w, g in enumerate(grads):
            _push(rule, g, 10 + w, clock=7, lent=_lent(how, w))
            taken.append(w)
            if idle:
                rule.idle()
        rule.advance(7, 8)
    assert (err.value.source, err.value.clock) == (10 + bad_at, 7)
    assert f"push from rank {10 + bad_at} for clock 7 holds non-finite values" in str(err.value)
    # idle: caught at once; busy: when the third push needs the buffer (the first two are
    # added) or in the step (the third)
    assert len(taken) == (bad_at + 1 if idle else max(bad_at + 1, 2))


@pytest.mark.parametrize("how", HOW)
def test_bsp_rule_reports_an_overflowing_sum_without_blaming_a_push(how):
    rule, _ = _rule()
    big = np.full(1001, 2e38, np.float32)
    for w in range(2):
        assert _push(rule, big, 10 + w, lent=_lent(how, w))
    rule.idle()                                 # each push is finite
    assert not rule.advance(0, 1)
