"""Staleness compensation: each method's server update against a plain numpy reference for a
scripted sequence of pulls and pushes with known staleness, what auto picks, and bad input."""
import argparse
import math

import numpy as np
import pytest

from psgd.nn.optim import make_optimizer
from psgd.protocols import get
from psgd.protocols.features import CompensationOptions, make_config
from psgd.protocols.momentum import mode as momentum_mode
from psgd.ps import compensation
from psgd.ps.compensation import amom
from psgd.ps.ssp import SspUpdate
from psgd.ps.versions import ShardVersions

N, W, LR, MU = 37, 3, 0.05, 0.9
# (event, worker, clock, staleness): a reply answers worker w's pull for clock c; a push is
# w's gradient for clock c, computed on that reply (staleness in clocks, as the server sees it)
SCRIPT = [("reply", 0, 0, 0), ("reply", 1, 0, 0), ("reply", 2, 0, 0),
          ("push", 0, 0, 0), ("reply", 0, 1, 0), ("push", 1, 0, 0), ("push", 0, 1, 1),
          ("reply", 1, 1, 0), ("reply", 0, 2, 0), ("push", 2, 0, 2), ("push", 1, 1, 1),
          ("reply", 2, 1, 0), ("push", 0, 2, 2), ("push", 2, 1, 1)]


def grad_for(w, clock):
    rng = np.random.default_rng(100 * w + clock)
    return (rng.standard_normal(N) * (1.0 + w)).astype(np.float32)


class Reference:
    """Momentum SGD in float32 numpy, with each method's rewrite written out plainly."""

    def __init__(self, method, params, lam=compensation.DEFAULT_LAMBDA):
        self.method, self.lam = method, lam
        self.w = params.astype(np.float32).copy()
        self.v = np.zeros(N, np.float32)
        self.ms = np.zeros(N, np.float32)
        self.updates, self.delays, self.read, self.count = 0, [], {}, {}
        self.velocities = np.zeros((W, N), np.float32)   # dana's, one per worker

    @staticmethod
    def mean_delay(delays):
        """amom's bias-corrected running mean of ``delays``, written as a weighted sum."""
        k = len(delays)
        if not k:
            return 0.0
        weights = [(1 - amom.DELAY_DECAY) * amom.DELAY_DECAY ** (k - 1 - i) for i in range(k)]
        return sum(wt * d for wt, d in zip(weights, delays)) / sum(weights)

    def reply(self, worker):
        """What the pull is answered with: the parameters, or dana's look-ahead."""
        self.read[worker] = self.w.copy()
        self.count[worker] = self.updates
        if self.method != "dana":
            return self.w
        mine = self.velocities[worker]
        others = self.velocities.sum(axis=0) - mine
        own = [d for w, d in self.delays if w == worker]   # this worker's delays only
        step = -LR / W * MU
        return (self.w + np.float32(step * self.mean_delay(own) / (W - 1)) * others
                + np.float32(step) * mine)

    def push(self, worker, g, staleness):
        lr, mu = np.float32(LR), np.float32(MU)
        delay = self.updates - self.count[worker]
        f32 = np.float32
        if self.method == "inverse":
            lr = f32(LR / (1.0 + staleness))
        elif self.method == "dcasgd":
            self.ms = f32(0.95) * self.ms + f32(0.05) * g * g
            g = g + f32(self.lam) * g * g * (self.w - self.read[worker]) / np.sqrt(self.ms + f32(1e-20))
        elif self.method == "gap":
            self.ms = f32(0.99) * self.ms + f32(0.01) * g * g
            c = f32(LR / (1.0 - MU)) * np.sqrt(self.ms) + f32(1e-20)
            g = g * (f32(1.0) / (f32(1.0) + np.abs(self.w - self.read[worker]) / c))
        elif self.method == "dana":   # bsp's momentum per worker, a step of lr / W
            self.delays.append((worker, delay))
            tau = self.mean_delay([d for _, d in self.delays])
            g = f32(min(1.0, (1.0 + tau) / (1.0 + delay))) * g   # a push staler than the mean
            self.velocities[worker] = mu * self.velocities[worker] + g
            self.w = self.w - f32(LR / W) * self.velocities[worker]
            self.updates += 1
            return
        elif self.method == "amom":
            self.delays.append(delay)
            tau = self.mean_delay(self.delays)
            residual = (1.0 - MU) * (1.0 + tau)
            mu_e, scale = (1.0 - residual, 1.0) if residual <= 1.0 else (0.0, 1.0 / residual)
            scale *= min(1.0, (self.updates + 1) / (amom.WARMUP_PER_WORKER * W))
            scale *= min(1.0, (1.0 + tau) / (1.0 + delay))   # a push staler than the mean
            mu, lr = f32(mu_e), f32(LR * scale)
        self.v = mu * self.v + g
        self.w = self.w - lr * self.v
        self.updates += 1


@pytest.mark.parametrize("method", ["none", "inverse", "dcasgd", "gap", "amom", "dana"])
def test_each_method_matches_its_numpy_reference_on_a_scripted_run(method):
    init = np.random.default_rng(7).standard_normal(N).astype(np.float32)
    config = make_config("asp", N, optimizer="momentum", opt_hparams={"momentum": MU},
                         lr_schedule=lambda c: LR, compensation=CompensationOptions(method))
    versions = ShardVersions(init.copy())
    rule = SspUpdate(config, make_optimizer("momentum", N, momentum=MU), versions, n_workers=W)
    ref = Reference(method, init)
    for event, w, clock, staleness in SCRIPT:
        if event == "reply":
            np.testing.assert_allclose(rule.replied(w, clock, versions.live), ref.reply(w),
                                       rtol=2e-6, atol=2e-7,
                                       err_msg=f"{method}'s reply to {w}'s pull of clock {clock}")
            continue
        g = grad_for(w, clock)
        assert rule.push(g.copy(), clock, staleness, source=1 + w, worker=w)
        ref.push(w, g, staleness)
        np.testing.assert_allclose(versions.live, ref.w, rtol=2e-6, atol=2e-7,
                                   err_msg=f"{method} after {w}'s push of clock {clock}")
    summary = rule.compensation()
    assert summary["method"] == method
    if method == "dana":   # counted per reply: how far each looked ahead
        assert summary[rule.comp.describes]["updates"] == 7
    elif method != "none":
        assert next(v for k, v in summary.items() if k != "method")["updates"] == 7


def test_dcasgd_corrects_only_what_moved_since_the_read():
    config = make_config("asp", N, optimizer="sgd", lr_schedule=lambda c: LR,
                         compensation=CompensationOptions("dcasgd", 0.5))
    versions = ShardVersions(np.zeros(N, np.float32))
    rule = SspUpdate(config, make_optimizer("sgd", N), versions, n_workers=1)
    rule.replied(0, 0, versions.live)
    g = np.ones(N, np.float32)
    rule.push(g, 0, 0, source=1, worker=0)     # read == now: no correction
    np.testing.assert_allclose(versions.live, -LR)
    assert rule.comp.factor.low == 0.0


def test_a_push_is_never_written_and_reads_follow_overlap_slots():
    config = make_config("ssp", N, staleness=2, overlap=True, optimizer="momentum",
                         lr_schedule=lambda c: LR, compensation=CompensationOptions("gap"))
    versions = ShardVersions(np.ones(N, np.float32))
    rule = SspUpdate(config, make_optimizer("momentum", N), versions, n_workers=2)
    assert rule.reads.shape == (2, 2, N)           # two slots per worker with overlap
    rule.replied(1, 4, versions.live)
    rule.replied(1, 5, np.full(N, 3.0, np.float32))  # the next clock's reply, ahead of the push
    g = grad_for(1, 4)
    lent = g.copy()
    lent.flags.writeable = False                    # as a worker's push-window segment
    assert rule.push(lent, 4, 0, source=3, worker=1)
    np.testing.assert_array_equal(lent, g)
    np.testing.assert_array_equal(rule.reads[1, 0], 1.0)   # clock 4 read the first reply
    assert rule.comp.factor.total == pytest.approx(1.0)      # nothing had moved since


def test_amom_scales_a_push_staler_than_the_mean_by_its_own_delay():
    config = make_config("asp", N, optimizer="momentum", opt_hparams={"momentum": MU},
                         lr_schedule=lambda c: LR, compensation=CompensationOptions("amom"))
    method = amom.AsyncAwareMomentum(config, make_optimizer("momentum", N, momentum=MU), N, 1)
    for _ in range(200):                                  # past the warm-up, mean delay 1
        _, lr = method.adjust(None, LR, 0, 1, None, None)
    assert lr == pytest.approx(LR)
    _, lr = method.adjust(None, LR, 0, 21, None, None)   # a straggler's push
    mean = method.delay.value
    assert 1.1 < mean < 1.3 and lr == pytest.approx(LR * (1 + mean) / 22)
    _, lr = method.adjust(None, LR, 0, 0, None, None)    # fresher than the mean: full step
    assert lr == pytest.approx(LR)


@pytest.mark.parametrize("warmup", [None, 0, 3])
def test_amom_warmup_ramps_the_rate_over_its_updates_per_worker(warmup):
    """--amom-warmup N: the step at update u is lr * min(1, u / (N W)) (N = 50 by default, 0:
    no ramp); every push fresh, so nothing else scales it."""
    config = make_config("asp", N, optimizer="momentum", opt_hparams={"momentum": MU},
                         compensation=CompensationOptions("amom", amom_warmup=warmup))
    method = amom.AsyncAwareMomentum(config, make_optimizer("momentum", N, momentum=MU), N, W)
    per_worker = amom.WARMUP_PER_WORKER if warmup is None else warmup
    for update in range(1, 2 * per_worker * W + 3):
        _, lr = method.adjust(None, LR, 0, 0, None, None)
        assert lr == pytest.approx(LR * min(1.0, update / (per_worker * W)) if per_worker else LR,
                                   rel=1e-12)


def test_amom_warmup_is_refused_without_amom_or_below_zero():
    plan = argparse.Namespace(optimizer="momentum")
    assert CompensationOptions("amom", amom_warmup=0).resolved(plan, get("asp")).amom_warmup == 0
    for method, warmup in (("dana", 5), (None, 5), ("amom", -1)):
        with pytest.raises(ValueError, match="--amom-warmup takes N >= 0 updates per worker"):
            CompensationOptions(method, amom_warmup=warmup).resolved(plan, get("asp"))


def test_explicit_momentum_keeps_the_gain_of_the_users_momentum():
    for tau in (0.0, 0.5, 3.0, 8.9):
        mu_e, scale = amom.explicit_momentum(0.9, tau)
        assert scale == 1.0
        # explicit times implicit gain, 1 / (1 - mu_e) * (1 + tau), stays 1 / (1 - 0.9)
        assert (1.0 - mu_e) / (1.0 + tau) == pytest.approx(0.1)
    mu_e, scale = amom.explicit_momentum(0.9, 19.0)
    assert mu_e == 0.0 and scale == pytest.approx(0.5)              # the rest from the step
    assert amom.explicit_momentum(0.0, 3.0) == (0.0, 0.25)


def test_running_mean_counts_the_first_values_fully():
    mean = amom.RunningMean()
    assert mean.add(4.0) == pytest.approx(4.0)
    assert mean.add(2.0) == pytest.approx((0.99 * 4 + 2) / 1.99)


@pytest.mark.parametrize("optimizer, picked", [("sgd", "none"), ("momentum", "dana"),
                                               ("nesterov", "dana"), ("adam", "dana-adam")])
def test_auto_picks_what_the_docs_say(optimizer, picked):
    assert compensation.resolve("auto", optimizer) == picked
    assert make_config("asp", 4, optimizer=optimizer).compensation.staleness_comp == picked
    assert make_config("ssp", 4, optimizer=optimizer).compensation.staleness_comp == picked


def test_synchronous_protocols_run_no_compensation_by_default():
    for name in ("bsp", "allreduce"):
        assert make_config(name, 4, optimizer="momentum").compensation.staleness_comp == "none"
    assert make_config("hogwild", 4, optimizer="momentum").compensation.staleness_comp == "amom"


def test_auto_falls_back_to_amom_where_dana_cannot_run():
    # hogwild has no server to keep per-worker velocities; with --momentum-correction the
    # workers keep the momentum, which dana would need on the server
    assert compensation.resolve("auto", "momentum", get("hogwild").compensation_choices()) == "amom"
    assert compensation.resolve("auto", "momentum", worker_momentum=True) == "amom"
    assert make_config("asp", 4, optimizer="momentum",
                       worker_momentum={"momentum": MU}).compensation.staleness_comp == "amom"
    assert momentum_mode(get("asp"), "auto", optimizer="momentum", feedback=True,
                         staleness_comp="auto") == "workers"
    assert momentum_mode(get("asp"), "auto", optimizer="momentum", feedback=True,
                         staleness_comp="dana") == "servers"
    # nor dana-adam, where no server answers the reads (hogwild refuses adam before this)
    assert compensation.resolve("auto", "adam", get("hogwild").compensation_choices()) == "none"


def test_dana_adam_matches_its_numpy_reference_on_a_scripted_run():
    """Adam on every push as it comes; each reply looked ahead by Adam's bias-corrected
    direction times beta1 (1 - beta1^d) / (1 - beta1), d the worker's own mean delay."""
    f32, lr, b1, b2, eps = np.float32, 0.01, 0.9, 0.999, 1e-8
    init = np.random.default_rng(5).standard_normal(N).astype(np.float32)
    config = make_config("asp", N, optimizer="adam", lr_schedule=lambda c: lr,
                         compensation=CompensationOptions("dana-adam"))
    versions = ShardVersions(init.copy())
    rule = SspUpdate(config, make_optimizer("adam", N), versions, n_workers=W)
    w, m, v, t = init.copy(), np.zeros(N, np.float32), np.zeros(N, np.float32), 0
    count, delays = {}, []

    def direction():
        return m / (np.sqrt(v) / f32(np.sqrt(1 - b2 ** t)) + f32(eps))
    for event, worker, clock, staleness in SCRIPT:
        if event == "reply":
            count[worker] = t
            own = [d for k, d in delays if k == worker]
            ahead = b1 * (1 - b1 ** Reference.mean_delay(own)) / (1 - b1)
            expected = w if t == 0 else w - f32(lr * ahead / (1 - b1 ** t)) * direction()
            np.testing.assert_allclose(rule.replied(worker, clock, versions.live), expected,
                                       rtol=2e-6, atol=2e-7)
            continue
        g = grad_for(worker, clock)
        assert rule.push(g.copy(), clock, staleness, source=1 + worker, worker=worker)
        delays.append((worker, t - count[worker]))
        t += 1
        m = f32(b1) * m + f32(1 - b1) * g
        v = f32(b2) * v + f32(1 - b2) * g * g
        w = w - f32(lr / (1 - b1 ** t)) * direction()
        np.testing.assert_allclose(versions.live, w, rtol=2e-6, atol=2e-7)


def test_dana_answers_each_overlap_slot_from_its_own_buffer_and_waits_for_its_send():
    config = make_config("ssp", N, staleness=2, overlap=True, optimizer="momentum",
                         lr_schedule=lambda c: LR, compensation=CompensationOptions("dana"))
    versions = ShardVersions(np.ones(N, np.float32))
    rule = SspUpdate(config, make_optimizer("momentum", N), versions, n_workers=2)
    assert rule.push(grad_for(0, 0), 0, 0, source=1, worker=0)
    first = rule.replied(1, 4, versions.live)
    second = rule.replied(1, 5, versions.live)
    assert first is not second and first is not versions.live
    np.testing.assert_array_equal(first, second)

    class Pending:
        tests = 0

        def Test(self, status=None):
            self.tests += 1
            return self.tests > 2
    send = Pending()
    rule.reply_sent(1, 4, send)
    assert rule.requests() == [send]
    rule.replied(1, 6, versions.live)        # clock 6 reuses clock 4's buffer: waits first
    assert send.tests == 3 and rule.requests() == []


def settings_of(tmp_path, *flags):
    from psgd.run import settings
    data = tmp_path / "d.h5"
    data.write_bytes(b"")
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    return settings.resolve(parser.parse_args(["--data", str(data), *flags]), environ={})


@pytest.mark.parametrize("flags, message", [
    (["--staleness-comp", "magic"], "--staleness-comp 'magic' is not one of none, inverse"),
    (["--protocol", "bsp", "--staleness-comp", "dcasgd"],
     "--staleness-comp dcasgd does not apply to --protocol bsp: its steps are never stale"),
    (["--protocol", "allreduce", "--staleness-comp", "auto"],
     "does not apply to --protocol allreduce"),
    (["--protocol", "hogwild", "--staleness-comp", "gap"],
     "does not apply to --protocol hogwild: a hogwild worker never sees"),
    (["--protocol", "asp", "--staleness-comp", "dcasgd", "--comp-lambda", "-1"],
     "--comp-lambda must be >= 0, got -1"),
    (["--protocol", "asp", "--staleness-comp", "gap", "--comp-lambda", "1"],
     "--comp-lambda applies to --staleness-comp dcasgd only"),
    (["--protocol", "asp", "--staleness-lr", "inverse", "--staleness-comp", "gap"],
     "disagree"),
    (["--protocol", "asp", "--staleness-comp", "dana", "--optimizer", "adam"],
     "--staleness-comp dana is built on the optimizer's own state: it needs --optimizer "
     "momentum or nesterov, not adam"),
    (["--protocol", "ssp", "--staleness-comp", "dana-adam", "--optimizer", "momentum"],
     "--staleness-comp dana-adam is built on the optimizer's own state: it needs --optimizer "
     "adam, not momentum"),
    (["--protocol", "hogwild", "--staleness-comp", "dana", "--optimizer", "momentum"],
     "does not apply to --protocol hogwild"),
    (["--protocol", "asp", "--staleness-comp", "dana", "--optimizer", "momentum",
      "--compress", "topk:0.01", "--momentum-correction", "on"],
     "--momentum-correction on does not apply with --staleness-comp dana"),
])
def test_bad_compensation_settings_are_one_clear_line(tmp_path, flags, message):
    with pytest.raises(ValueError, match=message):
        settings_of(tmp_path, *flags)


def test_settings_record_the_method_asked_for(tmp_path):
    def method(*flags):
        return settings_of(tmp_path, *flags).compensation.staleness_comp
    assert method("--protocol", "asp") == "auto"
    assert method("--protocol", "bsp") == "none"
    assert method("--protocol", "asp", "--staleness-lr", "inverse") == "inverse"
    assert math.isinf(make_config("asp", 4).staleness)


@pytest.mark.parametrize("name", ["momentum", "nesterov"])
def test_dana_keeps_weight_decay_in_each_workers_velocity_and_nesterov_is_its_look_ahead(name):
    """Two workers, weight decay, against bsp's momentum written per worker in numpy; the
    server's optimizer is left stepping plain SGD on what dana returns.  Nesterov's correction
    is the reply's look-ahead by the worker's own velocity, so nesterov steps as momentum."""
    wd, f32 = 0.01, np.float32
    init = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    config = make_config("asp", N, optimizer=name, lr_schedule=lambda c: LR,
                         opt_hparams={"momentum": MU, "weight_decay": wd}, compensation=CompensationOptions("dana"))
    versions = ShardVersions(init.copy())
    optimizer = make_optimizer(name, N, momentum=MU, weight_decay=wd)
    rule = SspUpdate(config, optimizer, versions, n_workers=2)
    assert (optimizer.momentum, optimizer.weight_decay, optimizer.nesterov) == (0.0, 0.0, False)
    w, v = init.copy(), np.zeros((2, N), np.float32)
    for clock, worker in [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0)]:
        rule.replied(worker, clock, versions.live)
        g = grad_for(worker, clock)
        assert rule.push(g.copy(), clock, 0, source=1 + worker, worker=worker)
        v[worker] = f32(MU) * v[worker] + (g + f32(wd) * w)
        w = w - f32(LR / 2) * v[worker]
        np.testing.assert_allclose(versions.live, w, rtol=2e-6, atol=2e-7)
    np.testing.assert_allclose(rule.comp.total, v.sum(axis=0), rtol=1e-6, atol=1e-6)


def test_dana_velocities_do_not_drift_apart_on_a_stiff_quadratic():
    """Two workers taking turns on f = lam / 2 |w|^2, each gradient taken at its reply.  A
    look-ahead by the other worker's velocity alone puts each gradient's brake on the others'
    momentum into the pusher's own velocity: the difference of the two velocities then grows
    by gamma + c lam per push (c the look-ahead's step) and diverges at this lam; with the
    worker's own velocity in the look-ahead the brake acts on the sum and both settle."""
    lam = np.float32(15.0)
    config = make_config("asp", N, optimizer="momentum", lr_schedule=lambda c: LR,
                         opt_hparams={"momentum": MU}, compensation=CompensationOptions("dana"))
    versions = ShardVersions(np.ones(N, np.float32))
    rule = SspUpdate(config, make_optimizer("momentum", N, momentum=MU), versions, n_workers=2)
    reads = [rule.replied(w, 0, versions.live).copy() for w in range(2)]
    for t in range(400):
        w, clock = t % 2, t // 2
        assert rule.push(lam * reads[w], clock, 1, source=1 + w, worker=w)
        reads[w] = rule.replied(w, clock + 1, versions.live).copy()
    assert np.abs(versions.live).max() < 1e-3
    assert np.abs(rule.comp.velocity[0] - rule.comp.velocity[1]).max() < 1e-2


def test_dana_stops_looking_ahead_by_a_finished_workers_velocity():
    config = make_config("asp", N, optimizer="momentum", lr_schedule=lambda c: LR,
                         compensation=CompensationOptions("dana"))
    versions = ShardVersions(np.zeros(N, np.float32))
    rule = SspUpdate(config, make_optimizer("momentum", N), versions, n_workers=3)
    for w in range(3):
        rule.replied(w, 0, versions.live)
    for w in (2, 1, 0):     # worker 0 pushes last: a delay of 2 updates
        assert rule.push(grad_for(w, 0), 0, 0, source=1 + w, worker=w)
    before = rule.replied(0, 1, versions.live) - versions.live
    assert np.abs(before).max() > 0
    rule.worker_done(1)
    rule.worker_done(2)     # worker 0 is alone now: only its own momentum lands with its push
    np.testing.assert_allclose(rule.replied(0, 2, versions.live),
                               versions.live - np.float32(LR / 3 * MU) * rule.comp.velocity[0],
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(rule.comp.total, rule.comp.velocity[0], atol=1e-6)
    assert np.abs(rule.comp.velocity[1:]).min() > 0    # kept for the final checkpoint


def test_dana_state_goes_into_a_snapshot_and_back_with_its_velocities():
    """A checkpoint keeps each worker's velocity: the server's snapshot holds them beside the
    optimizer's state, and a resumed rule steps on from them as the first would have."""
    from mpi4py import MPI
    from psgd.mpi.shardmap import ShardMap
    from psgd.ps.snapshots import Snapshots

    def rule_at(params):
        config = make_config("asp", N, optimizer="momentum", lr_schedule=lambda c: LR,
                             opt_hparams={"momentum": MU}, compensation=CompensationOptions("dana"))
        versions = ShardVersions(params.copy())
        return SspUpdate(config, make_optimizer("momentum", N, momentum=MU), versions,
                         n_workers=W), versions
    first, versions = rule_at(np.zeros(N, np.float32))
    for event, w, clock, staleness in SCRIPT:
        if event == "reply":
            first.replied(w, clock, versions.live)
        else:
            assert first.push(grad_for(w, clock), clock, staleness, source=1 + w, worker=w)
    taken = []
    snapshots = Snapshots(MPI.COMM_SELF, ShardMap(N, 1), 0, first.optimizer,
                          on_snapshot=lambda **kw: taken.append(kw), rule=first)
    snapshots.capture(7, versions.live)
    (snap,) = taken
    for i in range(W):
        np.testing.assert_array_equal(snap["opt_state"][f"dana_velocity_{i}"],
                                      first.comp.velocity[i])
    assert np.abs(first.comp.velocity).min() > 0
    resumed, again = rule_at(snap["params"])
    resumed.load_state(snap["opt_state"])
    np.testing.assert_allclose(resumed.comp.total, first.comp.total, rtol=1e-6, atol=1e-6)
    for rule, live in ((first, versions), (resumed, again)):   # a push with no delay
        rule.replied(1, 9, live.live)
        assert rule.push(grad_for(1, 9), 9, 0, source=2, worker=1)
    np.testing.assert_array_equal(again.live, versions.live)
    with pytest.raises(ValueError, match="checkpoint state 'dana_velocity_0' has shape"):
        resumed.comp.load_state({"dana_velocity_0": np.zeros(N + 1, np.float32)})


@pytest.mark.parametrize("method", ["dcasgd", "gap"])
def test_a_methods_running_mean_square_is_its_checkpointed_state(method):
    config = make_config("asp", N, optimizer="sgd", lr_schedule=lambda c: LR,
                         compensation=CompensationOptions(method))
    rule = SspUpdate(config, make_optimizer("sgd", N), ShardVersions(np.zeros(N, np.float32)),
                     n_workers=2)
    rule.replied(0, 0, rule.versions.live)
    assert rule.push(grad_for(0, 0), 0, 0, source=1, worker=0)
    (key, value), = rule.comp.state().items()
    assert key == f"{method}_meansq" and value is rule.comp.meansq and value.any()
