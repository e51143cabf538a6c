"""dana under --elastic: the method's count of the live workers (docs/design/elastic.md).

The rule itself is checked on the method object: with no loss an elastic rule over more slots
equals dana over a fixed set bit for bit, and after a loss and a join it equals a numpy
reference of dana over the live workers. The real runs (a worker SIGKILLed) are in
tests/test_elastic_dana_kills.py.
"""
import dataclasses
import types

import numpy as np
import pytest

from psgd.elastic.server import ElasticServer
from psgd.nn.optim import make_optimizer
from psgd.protocols.features import CompensationOptions, make_config
from psgd.ps.ssp import SspUpdate
from psgd.ps.versions import ShardVersions
from test_compensation import Reference as CompensationReference

mean_delay = CompensationReference.mean_delay   # amom's running mean, as a weighted sum

N, LR, MU = 29, 0.05, 0.9


def _rule(n_workers, method="dana", overlap=False, init=None):
    optimizer = "adam" if method == "dana-adam" else "momentum"
    config = make_config("asp", N, optimizer=optimizer, overlap=overlap,
                         opt_hparams={} if method == "dana-adam" else {"momentum": MU},
                         lr_schedule=lambda c: LR, compensation=CompensationOptions(method))
    versions = ShardVersions(np.zeros(N, np.float32) if init is None else init.copy())
    opt = make_optimizer(optimizer, N, **({} if method == "dana-adam" else {"momentum": MU}))
    return SspUpdate(config, opt, versions, n_workers=n_workers), versions


def _grad(w, clock):
    rng = np.random.default_rng(1000 * w + clock)
    return (rng.standard_normal(N) * (1.0 + 0.3 * w)).astype(np.float32)


def _script(workers, rounds, seed):
    """(event, worker, clock): each worker pulls clock c, then pushes it, in a shuffled order
    in which every push comes after its own pull."""
    rng, clocks, pulled, events = np.random.default_rng(seed), dict.fromkeys(workers, 0), {}, []
    while any(c < rounds for c in clocks.values()):
        w = int(rng.choice([w for w in workers if clocks[w] < rounds]))
        if pulled.get(w) == clocks[w]:
            events.append(("push", w, clocks[w]))
            clocks[w] += 1
        else:
            events.append(("reply", w, clocks[w]))
            pulled[w] = clocks[w]
    return events


def _play(rule, versions, events):
    """Replies (copies) and the parameters after each push."""
    seen = []
    for event, w, clock in events:
        if event == "reply":
            seen.append(rule.replied(w, clock, versions.live).copy())
        else:
            assert rule.push(_grad(w, clock), clock, 0, source=1 + w, worker=w)
            seen.append(versions.live.copy())
    return seen


@pytest.mark.parametrize("overlap", [False, True])
def test_with_no_loss_elastic_dana_equals_dana_over_a_fixed_set_bit_for_bit(overlap):
    init = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    events = _script([0, 1, 2], 6, seed=5)
    fixed, fixed_versions = _rule(3, overlap=overlap, init=init)
    elastic, elastic_versions = _rule(8, overlap=overlap, init=init)   # --max-workers 8
    elastic.vacate()
    for w in range(3):
        elastic.worker_joined(w)
    for k, (a, b) in enumerate(zip(_play(fixed, fixed_versions, events),
                                   _play(elastic, elastic_versions, events))):
        np.testing.assert_array_equal(a, b, err_msg=f"event {k}: {events[k]}")


class Reference:
    """dana over the live workers in float32 numpy: N = the workers joined and not lost, the
    look-ahead sums the live velocities, a lost worker's velocity gone, a joiner's from zero."""

    def __init__(self):
        self.w = np.zeros(N, np.float32)
        self.v, self.delays, self.own, self.count, self.updates = {}, [], {}, {}, 0

    def join(self, worker):
        self.v[worker], self.own[worker] = np.zeros(N, np.float32), []

    def lose(self, worker):
        del self.v[worker], self.own[worker]

    def reply(self, worker):
        self.count[worker] = self.updates
        n = len(self.v)
        if n < 2:
            return self.w
        mine = self.v[worker]
        others = sum(v for j, v in self.v.items() if j != worker)
        step = -LR / n * MU
        ahead = mean_delay(self.own[worker]) / (n - 1)
        return self.w + np.float32(step * ahead) * others + np.float32(step) * mine

    def push(self, worker, g):
        delay = self.updates - self.count[worker]
        self.delays.append(delay)
        self.own[worker].append(delay)
        scale = min(1.0, (1.0 + mean_delay(self.delays)) / (1.0 + delay))
        self.v[worker] = np.float32(MU) * self.v[worker] + np.float32(scale) * g
        self.w = self.w - np.float32(LR / len(self.v)) * self.v[worker]
        self.updates += 1


def test_after_a_loss_and_a_join_the_update_is_dana_over_the_live_workers():
    """Workers 0..3 join; worker 1 is lost at a known point (its last reply sent, its push
    never applied); worker 5 joins later. Every reply and step equals the reference's."""
    rule, versions = _rule(6)
    rule.vacate()
    ref = Reference()
    phases = [("join", [0, 1, 2, 3]), ("run", _script([0, 1, 2, 3], 3, seed=11)),
              ("run", [("reply", 1, 3)]), ("lose", [1]), ("run", _script([0, 2, 3], 2, seed=12)),
              ("join", [5]), ("run", _script([0, 2, 3, 5], 3, seed=13))]
    for kind, items in phases:
        for item in items:
            if kind == "join":
                rule.worker_joined(item)
                ref.join(item)
            elif kind == "lose":
                rule.worker_lost(item)
                ref.lose(item)
            elif item[0] == "reply":
                np.testing.assert_allclose(rule.replied(item[1], item[2], versions.live),
                                           ref.reply(item[1]), rtol=2e-6, atol=2e-7,
                                           err_msg=f"reply {item} after {kind}")
            else:
                assert rule.push(_grad(item[1], item[2]), item[2], 0, source=1, worker=item[1])
                ref.push(item[1], _grad(item[1], item[2]))
                np.testing.assert_allclose(versions.live, ref.w, rtol=2e-6, atol=2e-7,
                                           err_msg=f"push {item}")
    assert rule.comp.counted == 4   # 0, 2, 3 and 5
    assert not rule.comp.velocity[1].any()   # zeroed: no checkpoint carries it on


class Pending:
    """A send the lost worker never receives."""

    def Test(self, status=None):
        return False


def _three_pushed(rule, versions):
    """Workers 0, 1 and 2 join, pull clock 0 and push it."""
    rule.vacate()
    for w in (0, 1, 2):
        rule.worker_joined(w)
    for w in (0, 1, 2):
        rule.replied(w, 0, versions.live)
        assert rule.push(_grad(w, 0), 0, 0, source=1, worker=w)


@pytest.mark.parametrize("method", ["dana", "dana-adam"])
def test_a_lost_workers_look_ahead_send_is_not_waited_on(method):
    rule, versions = _rule(4, method)
    _three_pushed(rule, versions)
    sends = {}
    for w in (0, 1):
        reply = rule.replied(w, 1, versions.live)
        assert reply is not versions.live, "no look-ahead: the test proves nothing"
        sends[w] = Pending()
        rule.reply_sent(w, 1, sends[w])
    rule.worker_lost(1)
    assert rule.requests() == [sends[0]]   # the survivor's is still awaited
    rule.worker_done(0)
    assert rule.requests() == [sends[0]]


def test_one_live_worker_is_answered_with_the_parameters():
    rule, versions = _rule(4)
    rule.vacate()
    rule.worker_joined(2)
    assert rule.replied(2, 0, versions.live) is versions.live
    assert rule.push(_grad(2, 0), 0, 0, source=1, worker=2)
    np.testing.assert_array_equal(versions.live, -np.float32(LR) * _grad(2, 0))   # lr / 1


def test_a_resumed_run_gives_the_carried_velocities_to_its_first_joiners():
    rule, versions = _rule(4)
    _three_pushed(rule, versions)
    rule.worker_lost(0)
    resumed, resumed_versions = _rule(4, init=versions.live)
    resumed.load_state({k: v.copy() for k, v in rule.state().items()})
    assert resumed.carried() == [1, 2]
    resumed.vacate()
    assert not resumed.comp.total.any() and resumed.comp.counted == 0
    server = types.SimpleNamespace(state=["free"] * 4, carried=resumed.carried(), over=False)
    picks = []
    for _ in range(3):
        w = ElasticServer._free_slot(server)
        server.state[w] = "joining"
        picks.append(w)
        resumed.worker_joined(w)
    assert picks == [1, 2, 0]
    np.testing.assert_array_equal(resumed.comp.velocity[1:3], rule.comp.velocity[1:3])
    assert not resumed.comp.velocity[0].any()
    np.testing.assert_allclose(resumed.comp.total, rule.comp.total, rtol=1e-6, atol=1e-7)
    server.over = True
    server.state[3] = "free"
    assert ElasticServer._free_slot(server) == -1


def _amom_rule(n_workers, remote):
    """An amom rule (the momentum the workers' under ``remote``, --momentum-correction)."""
    config = make_config("asp", N, optimizer="momentum", opt_hparams={"momentum": MU},
                         lr_schedule=lambda c: LR, compensation=CompensationOptions("amom"))
    if remote:
        config = dataclasses.replace(config, worker_momentum={"momentum": MU})
    versions = ShardVersions(np.zeros(N, np.float32))
    return SspUpdate(config, make_optimizer("momentum", N, momentum=MU), versions,
                     n_workers=n_workers), versions


@pytest.mark.parametrize("remote", [False, True])
def test_elastic_amom_counts_the_live_workers_not_the_slots(remote):
    """amom (auto's pick where dana cannot run) ramps its rate over 50 W updates and, with
    the workers' momentum, steps it by W: under --elastic W is the live workers, as over a
    fixed set of them, before and after a loss (the old rule counted --max-workers slots)."""
    events = _script([0, 1, 2], 30, seed=7)
    fixed, fixed_versions = _amom_rule(3, remote)
    elastic, elastic_versions = _amom_rule(8, remote)   # --max-workers 8
    elastic.vacate()
    for w in range(3):
        elastic.worker_joined(w)
    pushes = [e for e in events if e[0] == "push"]
    for rule, versions in ((fixed, fixed_versions), (elastic, elastic_versions)):
        for _, w, clock in pushes:
            assert rule.push(_grad(w, clock), clock, 0, source=1 + w, worker=w)
    np.testing.assert_array_equal(fixed_versions.live, elastic_versions.live)
    assert fixed.comp.worker_momentum() == elastic.comp.worker_momentum()
    elastic.worker_lost(2)
    after_loss, _ = _amom_rule(2, remote)
    assert elastic.comp.counted == after_loss.comp.counted == 2
