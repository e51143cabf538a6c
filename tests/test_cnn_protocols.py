"""A small ResNet with batch norm and dropout learns a colour set under every protocol, and resumes
bit-exactly under bsp."""
import shutil

import numpy as np
import pytest

from conftest import assert_resumed_alike
from psgd.data import write_dataset
from psgd.run.metrics import read_log

RESNET = "conv:8x3:pad1-bn-relu-res:8-res:12:s2-gap-dropout:0.1-dense:4"


def colour_templates(n, seed, classes=4):
    """Fixed 3x8x8 colour templates per class plus Gaussian noise."""
    base = np.random.default_rng(99).standard_normal((classes, 3, 8, 8)).astype(np.float32)
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    return (base[y] + 1.5 * rng.standard_normal((n, 3, 8, 8))).astype(np.float32), y


@pytest.fixture(scope="module")
def colour(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "colour.h5"
    x, y = colour_templates(1600, seed=0)
    xt, yt = colour_templates(200, seed=1)
    write_dataset(path, x, y, xt, yt, n_classes=4, scale=1.0, offset=0.0, source="colour")
    return str(path)


def train(mpirun, ranks, data, *flags):
    return mpirun(ranks, ["-m", "psgd", "train", "--data", data, "--model", RESNET, "--quiet",
                          "--batch-size", 16, *map(str, flags)], timeout=180)


@pytest.mark.parametrize("protocol, ranks, servers", [
    ("bsp", 3, 1), ("ssp", 3, 1), ("asp", 3, 1), ("hogwild", 3, 1), ("allreduce", 2, 0),
    ("gossip", 3, 0), ("adpsgd", 2, 0)])
def test_resnet_with_batchnorm_learns_under_every_protocol(mpirun, colour, tmp_path, protocol,
                                                           ranks, servers):
    log = tmp_path / "run.jsonl"
    opt = "sgd" if protocol == "hogwild" else "momentum"
    train(mpirun, ranks, colour, "--protocol", protocol, "--servers", servers, "--optimizer", opt,
          "--lr", "0.05" if protocol == "hogwild" else "0.01", "--steps", 60, "--log", log)
    summary = read_log(log)[-1]
    assert summary["kind"] == "summary"
    assert summary["test_accuracy"] > 0.6, summary   # chance is 0.25; 0.90-0.95 seen


def test_resnet_bsp_interrupted_and_resumed_equals_uninterrupted(mpirun, colour, tmp_path):
    common = ["--protocol", "bsp", "--optimizer", "momentum", "--lr", "0.01", "--steps", 20,
              "--checkpoint-every", 10, "--seed", 3]
    full, part = tmp_path / "full", tmp_path / "part"
    train(mpirun, 3, colour, *common, "--servers", 1, "--checkpoint-dir", full,
          "--log", tmp_path / "full.jsonl")
    part.mkdir()
    shutil.copy(full / "ckpt-00000010.h5", part)
    train(mpirun, 4, colour, *common, "--servers", 2, "--checkpoint-dir", part, "--resume", part,
          "--log", tmp_path / "part.jsonl")
    assert_resumed_alike(tmp_path, full, part)


def test_train_augment_flag_reaches_the_workers(mpirun, colour, tmp_path):
    """`psgd train --augment` crops and flips the workers' batches (learning with it is
    test_cifar_cnn_learns.py's; these random templates are not flip-invariant)."""
    common = ["--protocol", "allreduce", "--servers", 0, "--optimizer", "momentum", "--lr", "0.01",
              "--steps", 10, "--seed", 5]
    runs = {}
    for name, extra in (("plain", []), ("augment", ["--augment"])):
        log = tmp_path / f"{name}.jsonl"
        train(mpirun, 2, colour, *common, *extra, "--log", log)
        runs[name] = read_log(log)
    assert next(r for r in runs["augment"] if r["kind"] == "config")["augment"] is True
    losses = {name: [r["loss"] for r in recs if r["kind"] == "step"] for name, recs in runs.items()}
    assert losses["plain"] != losses["augment"] and np.all(np.isfinite(losses["augment"]))
    assert runs["augment"][-1]["kind"] == "summary"
