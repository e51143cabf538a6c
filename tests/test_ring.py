"""allreduce and the allreduce protocol under mpiexec at 1 to 5 ranks."""
import re

import pytest


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_allreduce_matches_mpi_allreduce_and_ranks_agree(mpirun, n):
    result = mpirun(n, ["ring_check.py"], timeout=60)
    assert f"passed on {n} ranks, 1 node(s)" in result.stdout


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_allreduce_training_equals_single_process_sgd_and_replicas_agree(mpirun, n):
    result = mpirun(n, ["ring_train.py"], timeout=90)
    assert f"passed on {n} ranks, all-reduce {'shared' if n > 1 else 'none'}" in result.stdout


# ring_train's gradient is 105 floats: on one node ``auto`` takes the window's gather
# schedule.  The same invariant through its reduce-scatter, and through messages only
# (recursive doubling, the ring), as across nodes.
@pytest.mark.parametrize("env, algorithm", [
    ({"PSGD_ALLREDUCE_SMALL_BYTES": "0"}, "shared"),
    ({"PSGD_ALLREDUCE_SHARED_BYTES": "0"}, "doubling"),
    ({"PSGD_ALLREDUCE_SHARED_BYTES": "0", "PSGD_ALLREDUCE_SMALL_BYTES": "0"}, "ring"),
], ids=["shared-reduce-scatter", "doubling", "ring"])
def test_allreduce_training_invariant_holds_for_every_algorithm(mpirun, env, algorithm):
    result = mpirun(3, ["ring_train.py"], timeout=90, env=env)
    assert f"passed on 3 ranks, all-reduce {algorithm}" in result.stdout


def test_rank_waiting_in_ring_allreduce_for_late_neighbour_does_not_spin(mpirun):
    result = mpirun(2, ["ring_idle.py"], timeout=60)
    assert "ring_idle: passed" in result.stdout
    for run in ("doubling n=100", "ring n=1048576", "shared n=100", "shared n=1048576"):
        assert run in result.stdout
    for waits_for in ("rank 1 (all-reduce recursive doubling)",
                      "rank 1 (ring all-reduce, left neighbour)",
                      "rank 1 (shared-memory all-reduce)"):
        assert re.search(r"psgd: rank 0 stalled: waiting \d+ s for " + re.escape(waits_for),
                         result.stderr), result.stderr


def test_training_without_room_for_the_shared_window_ends_with_one_clear_error(mpirun, dataset):
    """The window cannot be had (here: a piece size no /dev/shm can hold): every rank stops at
    the first all-reduce with a message naming the window and the way round it."""
    proc = mpirun(2, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--model",
                      "mlp:784-16-10", "--protocol", "allreduce", "--steps", "2"],
                  env={"PSGD_ALLREDUCE_PIECE_BYTES": str(10 ** 14)}, check=False, timeout=60)
    assert proc.returncode != 0
    assert "shared-memory window (unable to allocate shared memory)" in proc.stderr, proc.stderr
    assert "PSGD_ALLREDUCE_SHARED_BYTES=0" in proc.stderr
    assert "Traceback" not in proc.stderr


# Emulated nodes (no namespace needed): MPICH puts rank r on clique r mod K and goes between
# cliques over TCP; ``auto`` then takes the hierarchical all-reduce, and ``shared`` is left out.
CLIQUES = {"FI_PROVIDER": "tcp", "MPICH_CH4_NETMOD": "ofi"}


@pytest.mark.parametrize("n, nodes", [(4, 2), (5, 3)])
def test_allreduce_across_emulated_nodes_matches_mpi_allreduce(mpirun, n, nodes):
    result = mpirun(n, ["ring_check.py"], timeout=120,
                    env={**CLIQUES, "MPIR_CVAR_NUM_CLIQUES": str(nodes)})
    assert f"passed on {n} ranks, {nodes} node(s)" in result.stdout


def test_rank_waiting_in_pipelined_hierarchical_allreduce_does_not_spin(mpirun):
    """Rank 0 leads node 0; the leaders' ring of its first chunk waits for late rank 1."""
    result = mpirun(4, ["ring_idle.py"], timeout=60,
                    env={**CLIQUES, "MPIR_CVAR_NUM_CLIQUES": "2"})
    assert "hierarchical n=1048576: waited" in result.stdout, result.stdout
    assert "rank 1 (ring all-reduce, left neighbour)" in result.stderr, result.stderr


def test_allreduce_training_across_emulated_nodes_takes_the_hierarchical_allreduce(mpirun):
    result = mpirun(4, ["ring_train.py"], timeout=120,
                    env={**CLIQUES, "MPIR_CVAR_NUM_CLIQUES": "2"})
    assert "passed on 4 ranks, all-reduce hierarchical" in result.stdout


def test_pipelined_chunks_per_buffer_size_and_leader_count():
    from psgd.collectives.hierarchical_pipeline import chunk_count
    assert chunk_count(4 << 20, 1 << 20, 2, 256 << 10) == 16
    assert chunk_count(100, 25, 2, 256 << 10) == 1          # under one chunk: not pipelined
    assert chunk_count(400, 100, 3, 1) == 33                # an element per leader per chunk
    assert chunk_count(8, 2, 3, 1) == 1
