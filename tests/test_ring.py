"""ring_allreduce and the allreduce protocol under mpiexec at 1 to 5 ranks."""
import re

import pytest


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_ring_allreduce_matches_mpi_allreduce_and_ranks_agree(mpirun, n):
    result = mpirun(n, ["ring_check.py"], timeout=60)
    assert f"passed on {n} ranks" in result.stdout


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_allreduce_training_equals_single_process_sgd_and_replicas_agree(mpirun, n):
    result = mpirun(n, ["ring_train.py"], timeout=90)
    assert f"passed on {n} ranks" in result.stdout


def test_rank_waiting_in_ring_allreduce_for_late_neighbour_does_not_spin(mpirun):
    result = mpirun(2, ["ring_idle.py"], timeout=60)
    assert "ring_idle: passed" in result.stdout
    for algorithm in ("doubling", "ring"):
        assert f"{algorithm} n=" in result.stdout
    for waits_for in ("rank 1 (all-reduce recursive doubling)",
                      "rank 1 (ring all-reduce, left neighbour)"):
        assert re.search(r"psgd: rank 0 stalled: waiting \d+ s for " + re.escape(waits_for),
                         result.stderr), result.stderr
