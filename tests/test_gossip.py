"""Decentralized training: the topologies' mixing matrices, D-PSGD and AD-PSGD against numpy
references under mpiexec, and the bad input they refuse."""
import os
import signal

import numpy as np
import pytest

from psgd.gossip import adpsgd, topology
from psgd.protocols import get
from psgd.run.checkpoint import list_checkpoints, load_checkpoint
from psgd.run.metrics import read_log
from psgd.run.signals import EXIT_STOPPED


@pytest.mark.parametrize("name", topology.TOPOLOGIES)
def test_every_mixing_matrix_is_symmetric_and_doubly_stochastic(name):
    checked = 0
    for n in range(1, 33):
        try:
            matrix = topology.mixing_matrix(name, n)
        except ValueError:
            assert name == "torus"
            continue
        checked += 1
        assert matrix.shape == (n, n)
        assert np.array_equal(matrix, matrix.T), (name, n)
        assert np.allclose(matrix.sum(0), 1, atol=1e-12) and np.allclose(matrix.sum(1), 1), (name, n)
        assert (matrix >= 0).all()
        # connected: the second-largest |eigenvalue| is below 1, so gossip reaches consensus
        eig = np.sort(np.abs(np.linalg.eigvalsh(matrix)))
        assert n == 1 or eig[-2] < 1 - 1e-9, (name, n, eig[-2])
    assert checked >= 17


def test_the_graphs_have_the_documented_neighbours():
    assert topology.neighbours("ring", 5)[0] == [1, 4]
    assert topology.neighbours("exponential", 8)[0] == [1, 2, 4, 6, 7]
    assert topology.neighbours("torus", 6)[0] == [1, 2, 3]          # 2 x 3
    assert topology.torus_shape(12) == (3, 4)
    assert topology.neighbours("torus", 9)[4] == [1, 3, 5, 7]
    assert topology.neighbours("complete", 4)[2] == [0, 1, 3]
    assert np.allclose(topology.mixing_matrix("ring", 5)[0], [1 / 3, 1 / 3, 0, 0, 1 / 3])


def test_adpsgd_pairs_even_with_odd_workers():
    assert adpsgd.partners("ring", 4) == [[1, 3], [0, 2], [1, 3], [0, 2]]
    assert adpsgd.partners("ring", 3) == [[1], [0, 2], [1]]   # the edge 2-0 joins two actives
    assert adpsgd.partners("exponential", 8)[0] == [1, 7]
    choices = {adpsgd.choose(1, clock, 0, [1, 3]) for clock in range(50)}
    assert choices == {1, 3}
    assert adpsgd.choose(1, 5, 0, [1, 3]) == adpsgd.choose(1, 5, 0, [1, 3])


@pytest.mark.parametrize("protocol, topo, workers, words", [
    ("gossip", "star", 4, "--topology 'star' is not one of ring, torus, exponential, complete"),
    ("gossip", "torus", 5, "--topology torus needs W = R x C workers with R, C >= 2, but W = 5"),
    ("gossip", "torus", 2, "but W = 2 is not such a product"),
    ("adpsgd", "ring", 1, "--protocol adpsgd needs at least 2 workers"),
    ("allreduce", "ring", 4, "--topology applies to --protocol gossip or adpsgd only, not allreduce"),
])
def test_an_impossible_topology_is_one_clear_error(protocol, topo, workers, words):
    with pytest.raises(ValueError) as info:
        get(protocol).check(topology=topo, n_workers=workers)
    assert words in str(info.value)


def test_gossip_has_no_servers():
    with pytest.raises(ValueError, match="--protocol gossip has no servers: use --servers 0"):
        get("gossip").check(n_servers=1)


@pytest.mark.parametrize("ranks", [2, 4])
def test_dpsgd_and_adpsgd_match_their_numpy_references(mpirun, ranks):
    """Every topology: lr = 0 reaches the initial average, every step keeps the average (to
    round-off) and moves it by -lr * mean_i g_i(x_i); every worker's model follows D-PSGD's
    x <- W x - lr g in float64; AD-PSGD with its seeded pairing order equals a serial run."""
    out = mpirun(ranks, ["gossip_check.py"], timeout=120).stdout
    assert "gossip ok" in out, out


MLP = "mlp:784-32-10"


def _train(mpirun, ranks, dataset, tmp_path, *flags, name="run"):
    log = tmp_path / f"{name}.jsonl"
    mpirun(ranks, ["-m", "psgd", "train", "--data", dataset, "--model", MLP, "--quiet",
                   "--batch-size", 16, "--lr", "0.01", "--log-every", 10, "--log", log, *flags],
           timeout=120)
    return read_log(log)


@pytest.mark.parametrize("protocol, topo, ranks, optimizer", [      # make test keeps gossip
    pytest.param("gossip", "ring", 3, "momentum", marks=pytest.mark.e2e),
    ("adpsgd", "ring", 4, "adam")])
def test_the_mean_model_is_evaluated_logged_and_checkpointed_and_resumes_elsewhere(
        mpirun, dataset, tmp_path, protocol, topo, ranks, optimizer):
    from psgd.nn.model import build_model
    from psgd.data.reader import ShardReader
    ckdir = tmp_path / "ck"
    records = _train(mpirun, ranks, dataset, tmp_path, "--protocol", protocol, "--topology", topo,
                     "--optimizer", optimizer, "--steps", 40, "--eval-every", 20,
                     "--checkpoint-dir", ckdir, "--checkpoint-every", 20)
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 4 and all(r["consensus_distance"] >= 0 for r in steps), steps
    assert any(r["consensus_distance"] > 0 for r in steps)   # the models do differ
    evals = [r for r in records if r["kind"] == "eval"]
    assert len(evals) == 2 and all("own_test_accuracy" in r for r in evals), evals
    summary = records[-1]
    model = build_model(MLP)
    # ring of 3: each worker sends its model to 2 neighbours a step; adpsgd on 4: each of the
    # 2 active workers' averages moves 2 models a step, 4 models over 4 workers
    per_step = 4 * model.n_params * (2 if protocol == "gossip" else 1)
    assert summary["bytes_per_worker_step"] == per_step, summary
    # the checkpoint holds the workers' mean model: the one the summary evaluated
    ckpt = load_checkpoint(list_checkpoints(ckdir)[-1])
    assert ckpt.step == 40 and ckpt.protocol == protocol
    model.params[:] = ckpt.params
    x, y = ShardReader(dataset, 0, 1, 16).test_set()
    assert model.evaluate(x, y)[0] == pytest.approx(summary["test_loss"], rel=1e-6)
    # and resumes under another protocol
    more = _train(mpirun, 2, dataset, tmp_path, "--protocol", "allreduce", "--optimizer",
                  optimizer, "--steps", 60, "--resume", list_checkpoints(ckdir)[-1], name="more")
    assert (more[-1]["start_step"], more[-1]["steps"]) == (40, 60)
    assert "consensus_distance" not in more[-1]


def test_a_signal_stops_adpsgd_at_one_step_and_it_resumes(mpirun, dataset, tmp_path):
    """AD-PSGD's passive workers answer while the stop checks wait: all stop at one check."""
    from test_stop import EVERY, STEPS, _common, _signal_mid_run
    out, err, rc, ckdir = _signal_mid_run(dataset, tmp_path, "adpsgd", 3, 0, 1, signal.SIGTERM,
                                          f"stop-adpsgd-{os.getpid()}")
    assert rc == EXIT_STOPPED, (out, err)
    stopped = load_checkpoint(list_checkpoints(ckdir)[-1])
    assert 0 < stopped.step < STEPS and stopped.step % EVERY == 0, stopped.step
    mpirun(3, ["-m", "psgd", "train", "--data", dataset, *_common("adpsgd", 0),
               "--checkpoint-dir", ckdir, "--resume", "auto", "--log", tmp_path / "b.jsonl"])
    resumed = read_log(tmp_path / "b.jsonl")[-1]
    assert (resumed["start_step"], resumed["steps"], resumed["stopped"]) == (stopped.step, STEPS, None)
