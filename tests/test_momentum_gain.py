"""--momentum-correction gain (bsp): error feedback on the gradients and the servers' plain SGD
at lr / (1 - momentum), against a numpy reference; where auto chooses it."""
import json

import numpy as np
import pytest

from psgd.protocols import get
from psgd.protocols.momentum import mode

MU, LR, N, BUCKET, STEPS = 0.9, 0.05, 1000, 512, 6


def test_auto_steps_at_the_gain_under_bsp_with_sign_and_error_feedback_only():
    """bsp with sign's error feedback and momentum: the gain, not the workers' velocities;
    top-k keeps its velocities; without feedback (uncompressed bsp) the servers' momentum as
    before; other protocols as before."""
    from psgd.compress.gain import auto_feedback
    assert auto_feedback("sign", True, 512)
    assert not auto_feedback("sign", False, 512)
    assert not auto_feedback("topk:0.01", True, 512)
    assert not auto_feedback("qsgd:4", True, 512)
    assert not auto_feedback("none", False, 512)
    bsp = get("bsp")

    def where(protocol, setting, optimizer="momentum", feedback=True, gain_feedback=False):
        return mode(protocol, setting, optimizer=optimizer, feedback=feedback,
                    gain_feedback=gain_feedback)
    assert where(bsp, "auto", gain_feedback=True) == "gain"
    assert where(bsp, "auto", "nesterov", gain_feedback=True) == "gain"
    assert where(bsp, "auto") == "workers"   # top-k
    assert where(bsp, "auto", feedback=False) == "servers"
    assert where(bsp, "auto", "sgd", gain_feedback=True) == "servers"
    assert where(bsp, "gain", feedback=False) == "gain"
    assert where(bsp, "on", gain_feedback=True) == "workers"
    for name in ("ssp", "asp", "allreduce"):
        assert where(get(name), "auto", gain_feedback=True) == "workers"


def test_the_servers_step_is_sgd_at_the_momentums_gain():
    from psgd.compress.gain import server_step
    optimizer, hparams, schedule = server_step(MU, 1e-3, lambda clock: LR * (clock + 1))
    assert optimizer == "sgd" and hparams == {"weight_decay": 1e-3}
    assert schedule(2) == pytest.approx(3 * LR / (1 - MU), rel=1e-15)


def sign_reference(workers):
    """The parameters after STEPS bsp steps of sign with error feedback on each worker's
    scripted gradients (compress_check.py's) and plain SGD at LR / (1 - MU), in numpy."""
    params = np.arange(N, dtype=np.float64) / 8
    rngs = [np.random.default_rng(w) for w in range(workers)]
    residual = np.zeros((workers, N), np.float32)
    for _ in range(STEPS):
        sent = np.zeros(N)
        for w, rng in enumerate(rngs):
            p = (rng.integers(-1023, 1024, N) / 16).astype(np.float32) + residual[w]
            scale = np.zeros(N, np.float32)
            for lo in range(0, N, BUCKET):
                scale[lo:lo + BUCKET] = np.abs(p[lo:lo + BUCKET]).mean(dtype=np.float64)
            decoded = np.where(p >= 0, scale, -scale)
            residual[w] = p - decoded
            sent += decoded
        params -= LR / (1 - MU) * sent / workers
    return params


def test_bsp_sign_at_the_gain_follows_a_numpy_reference(mpirun):
    proc = mpirun(4, ["compress_check.py", "sign", "--gain", MU, "--lr", LR,
                      "--steps", STEPS], timeout=120)
    got = np.array(json.loads(proc.stdout.split("RESULT ", 1)[1])["params"])
    want = sign_reference(3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_plan_moves_the_momentum_where_the_mode_says():
    from psgd.protocols.momentum import plan
    hparams = {"momentum": MU, "weight_decay": 1e-3}

    def run(setting, gain_feedback):
        return plan(get("bsp"), setting, optimizer="nesterov", momentum=MU, weight_decay=1e-3,
                    opt_hparams=hparams, schedule=lambda clock: LR, feedback=True,
                    gain_feedback=gain_feedback, staleness_comp=None)
    gain = run("auto", True)
    assert (gain.optimizer, gain.opt_hparams, gain.worker_momentum) == (
        "sgd", {"weight_decay": 1e-3}, None)
    assert gain.momentum_gain == MU and gain.schedule(0) == pytest.approx(LR / (1 - MU))
    workers = run("on", True)
    assert workers.worker_momentum == {**hparams, "nesterov": True}
    assert workers.opt_hparams == {"momentum": 0.0, "weight_decay": 0.0}
    servers = run("off", True)
    assert (servers.optimizer, servers.opt_hparams, servers.momentum_gain) == ("nesterov", hparams, 0.0)
