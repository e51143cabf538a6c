"""--momentum-correction: the workers push their velocities and the average takes a plain step."""
import json
import shutil

import numpy as np
import pytest

from psgd.compress.momentum import WorkerMomentum
from psgd.kernels.optim import momentum_step
from psgd.protocols import get
from psgd.protocols.momentum import mode
from psgd.run.checkpoint import list_checkpoints, load_checkpoint

MLP = "mlp:784-32-10"


@pytest.mark.parametrize("nesterov", [False, True])
def test_a_step_along_the_workers_direction_is_the_momentum_step(nesterov):
    """params - lr * direction equals the server's momentum step bit for bit, step after step,
    and the direction follows a float64 reference."""
    rng = np.random.default_rng(0)
    n, lr, mu, wd = 1001, 0.05, 0.9, 1e-3
    params = rng.standard_normal(n).astype(np.float32)
    server_params, server_velocity = params.copy(), np.zeros(n, np.float32)
    worker = WorkerMomentum(n, mu, nesterov, wd)
    ref_v = np.zeros(n)
    for _ in range(5):
        grad = rng.standard_normal(n).astype(np.float32)
        g = grad + np.float64(np.float32(wd)) * params
        ref_v = np.float64(np.float32(mu)) * ref_v + g
        ref = g + np.float64(np.float32(mu)) * ref_v if nesterov else ref_v
        direction = worker.apply(grad, params)
        np.testing.assert_allclose(direction, ref, rtol=1e-5, atol=1e-6)
        momentum_step(server_params, grad, server_velocity, None, lr, mu, wd, nesterov)
        # the step that takes the direction: momentum 0, no weight decay (what the servers run)
        momentum_step(params, direction, np.zeros(n, np.float32), None, lr, 0.0, 0.0, False)
        np.testing.assert_array_equal(params, server_params)


def test_auto_moves_momentum_where_error_feedback_runs_and_on_needs_momentum():
    asp, hogwild = get("asp"), get("hogwild")

    def moves(protocol, setting, optimizer, feedback):
        return mode(protocol, setting, optimizer=optimizer, feedback=feedback) == "workers"
    assert moves(asp, "auto", "momentum", True)
    assert not moves(asp, "auto", "momentum", False)
    assert not moves(hogwild, "auto", "nesterov", True)   # its entry has no momentum_correction
    assert not moves(asp, "auto", "sgd", True)
    assert moves(asp, "on", "nesterov", False)
    assert not moves(asp, "off", "momentum", True)
    with pytest.raises(ValueError, match="needs --optimizer momentum or nesterov, not adam"):
        mode(asp, "on", optimizer="adam", feedback=True)
    with pytest.raises(ValueError, match="'yes' is not auto, on, off or gain"):
        mode(asp, "yes", optimizer="momentum", feedback=True)


@pytest.mark.parametrize("flags, message", [
    (["--protocol", "hogwild", "--optimizer", "momentum", "--momentum-correction", "on"],
     "--momentum-correction on applies to --protocol bsp or ssp or asp or allreduce, whose "
     "workers can keep the momentum of the servers' step, not hogwild"),
    (["--protocol", "asp", "--optimizer", "momentum", "--staleness-comp", "dcasgd",
      "--momentum-correction", "on"],
     "--momentum-correction on does not apply with --staleness-comp dcasgd, which rewrites "
     "each gradient before the momentum sums it"),
    (["--protocol", "ssp", "--optimizer", "momentum", "--staleness-comp", "gap",
      "--momentum-correction", "on"], "--staleness-comp gap, which rewrites"),
    (["--protocol", "bsp", "--optimizer", "sgd", "--momentum-correction", "on"],
     "needs --optimizer momentum or nesterov, not sgd"),
    (["--protocol", "bsp", "--optimizer", "adam", "--momentum-correction", "gain"],
     "--momentum-correction gain needs --optimizer momentum or nesterov, not adam"),
    (["--protocol", "asp", "--optimizer", "momentum", "--momentum-correction", "gain"],
     "--momentum-correction gain applies to --protocol bsp, whose step averages every "
     "worker's push of a clock, not asp"),
    (["--protocol", "bsp", "--optimizer", "momentum", "--momentum-correction", "yes"],
     "--momentum-correction 'yes' is not auto, on, off or gain"),
])
def test_momentum_correction_bad_input_is_one_line(dataset, flags, message):
    import argparse

    from psgd.run import settings
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    with pytest.raises(ValueError, match=message):
        settings.resolve(parser.parse_args(["--data", dataset, *flags]), environ={})


def train(mpirun, n, data, tmp_path, name, *flags):
    ckdir = tmp_path / name
    mpirun(n, ["-m", "psgd", "train", "--data", data, "--quiet", "--model", MLP,
               "--batch-size", 16, "--optimizer", "momentum", "--lr", "0.05",
               "--weight-decay", "0.001", "--checkpoint-dir", ckdir, *map(str, flags)],
           timeout=180)
    return ckdir


@pytest.mark.parametrize("protocol, ranks", [("bsp", 2), ("allreduce", 1), ("asp", 2)])
def test_one_worker_with_its_momentum_moved_ends_where_the_servers_momentum_ends(
        mpirun, dataset, tmp_path, protocol, ranks):
    common = ("--protocol", protocol, "--steps", 12, "--compress", "none")
    if protocol == "asp":   # auto would run dana on the servers' side, amom on the workers'
        common += ("--staleness-comp", "amom")
    a = train(mpirun, ranks, dataset, tmp_path, "server", *common, "--momentum-correction", "off")
    b = train(mpirun, ranks, dataset, tmp_path, "worker", *common, "--momentum-correction", "on")
    pa, pb = (load_checkpoint(list_checkpoints(d)[-1]).params for d in (a, b))
    np.testing.assert_array_equal(pa, pb)   # asp: delay 0, so amom's momentum is the user's


@pytest.mark.parametrize("servers", [1, 2])
def test_under_asp_each_workers_velocity_takes_the_momentum_its_server_sent(mpirun, servers):
    proc = mpirun(servers + 2, ["ps_check.py", "momentum", "--servers", servers, "--steps", 40],
                  timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr
    assert json.loads(lines[-1][len("RESULT "):])["lowest"] < 0.9


@pytest.mark.parametrize("n_workers", [1, 2, 4])
def test_amom_moved_to_the_workers_sends_the_momentum_of_a_velocity_stepped_every_w_updates(
        n_workers):
    """amom with the momentum on the workers: the servers' momentum mu_e raised to the power W
    (a worker steps once per W updates) and the learning rate times (1 - mu_e ** W) / (1 - mu_e);
    the servers' optimizer keeps momentum 0.  One worker: the servers' momentum and step."""
    from psgd.nn.optim import make_optimizer
    from psgd.protocols.features import make_config
    from psgd.ps.compensation.amom import AsyncAwareMomentum
    local_opt, remote_opt = (make_optimizer("momentum", 4, momentum=m) for m in (0.9, 0.0))
    local = AsyncAwareMomentum(make_config("asp", 4), local_opt, 4, n_workers=n_workers)
    remote = AsyncAwareMomentum(make_config("asp", 4, worker_momentum={"momentum": 0.9}),
                                remote_opt, 4, n_workers=n_workers)
    assert remote.worker_momentum() == 0.9 and local.worker_momentum() == 0.0
    grad = np.ones(4, np.float32)
    for delay in [0, 1, 3, 1, 0, 12, 2, 1]:
        (_, lr_local), (_, lr_remote) = (c.adjust(grad, 0.05, delay, delay, None, None)
                                         for c in (local, remote))
        mu_e = local_opt.momentum
        assert remote.worker_momentum() == mu_e ** n_workers
        gain = 1.0 if n_workers == 1 or mu_e == 0 else (1 - mu_e ** n_workers) / (1 - mu_e)
        assert lr_remote == pytest.approx(lr_local * gain, rel=1e-12)
        assert remote_opt.momentum == 0.0
    assert 0.0 <= remote.worker_momentum() < 0.9


@pytest.mark.parametrize("mu_e", [0.0, 0.3, 0.6, 0.9])
@pytest.mark.parametrize("n_workers", [1, 2, 4, 8])
def test_a_workers_velocity_steps_over_each_w_updates_what_the_servers_momentum_would(
        mu_e, n_workers):
    """One gradient's steps (its impulse response): the servers' momentum moves it by
    lr mu_e ** k at every update k, a worker's velocity by lr scale mu_w ** j at its own steps,
    updates jW; the two add up to the same over each W updates, so to the same in all."""
    from psgd.ps.compensation.amom import velocity_momentum
    mu_w, scale = velocity_momentum(mu_e, n_workers)
    for j in range(6):
        servers = sum(mu_e ** k for k in range(j * n_workers, (j + 1) * n_workers))
        assert scale * mu_w ** j == pytest.approx(servers, rel=1e-12)
    assert velocity_momentum(mu_e, 1) == (mu_e, 1.0)


def test_two_workers_moved_match_the_server_and_resume_where_they_left_off(mpirun, dataset,
                                                                         tmp_path):
    """W = 2: the mean of two velocities is the momentum of the mean up to float32 rounding;
    and a run resumed from its step-10 checkpoint starts every worker's velocity from it."""
    common = ("--protocol", "bsp", "--steps", 20, "--checkpoint-every", 10)
    a = train(mpirun, 3, dataset, tmp_path, "server", *common, "--momentum-correction", "off")
    b = train(mpirun, 3, dataset, tmp_path, "worker", *common, "--momentum-correction", "on")
    end_a, end_b = (load_checkpoint(d / "ckpt-00000020.h5") for d in (a, b))
    start = load_checkpoint(a / "ckpt-00000010.h5").params
    np.testing.assert_allclose(end_b.params, end_a.params, rtol=0, atol=1e-6)
    assert np.abs(end_a.params - start).max() > 1e-3     # the runs moved far past that
    part = tmp_path / "part"
    part.mkdir()
    shutil.copy(b / "ckpt-00000010.h5", part)
    mpirun(3, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--resume", part,
               "--checkpoint-dir", part], timeout=180)
    resumed = load_checkpoint(part / "ckpt-00000020.h5")
    np.testing.assert_allclose(resumed.params, end_b.params, rtol=0, atol=1e-6)


WORKERS = "; momentum on the workers (--momentum-correction)"
GAIN = "; momentum as its gain: plain SGD at lr / (1 - momentum) (--momentum-correction)"


@pytest.mark.parametrize("flags, where", [
    (("bsp",), GAIN), (("asp",), WORKERS), (("bsp", "--momentum-correction", "on"), WORKERS),
    (("bsp", "--compress", "topk:0.1"), WORKERS),
    (("bsp", "--compress", "topk:0.1", "--momentum-correction", "gain"), GAIN),
    (("asp", "--staleness-comp", "dcasgd"), "")])
def test_the_closing_line_says_where_momentum_ran(mpirun, dataset, tmp_path, flags, where):
    out = mpirun(3, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--model", MLP,
                     "--batch-size", 16, "--optimizer", "momentum", "--lr", "0.05", "--steps", 4,
                     "--compress", "sign", "--protocol", *flags], timeout=120).stdout
    line = next(text for text in out.splitlines() if " pushes: " in text)
    assert line.endswith("; error feedback on" + where)
