"""Decentralized training: the topologies' mixing matrices, D-PSGD and AD-PSGD against numpy
references under mpiexec, and the bad input they refuse."""
import numpy as np
import pytest

from psgd.gossip import adpsgd, topology
from psgd.protocols import get


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
