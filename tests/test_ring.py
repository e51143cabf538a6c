"""allreduce and the allreduce protocol under mpiexec at 1 to 5 ranks.

The checks at 1..5 ranks on one node share one launch (tests/mpi/ring_suite.py: ``mpiexec
-n 5`` split into communicators of 1..5 ranks); each test below reads its stage's line."""
import re

import pytest
from conftest import run_mpi


def stage_line(proc, text: str) -> None:
    """``text`` is in the launch's stdout; else the launch's exit and output, to see why."""
    assert text in proc.stdout, (f"{text!r} missing: exit {proc.returncode}\n--- stdout\n"
                                 f"{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}")


@pytest.fixture(scope="module")
def suite():
    """One ``mpiexec -n 5`` of ring_suite.py: every stage on 1..5 ranks of one node."""
    return run_mpi(5, ["ring_suite.py"], timeout=600, check=False,
                   env={"PSGD_STALL_TIMEOUT": "600"})


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_allreduce_matches_mpi_allreduce_and_ranks_agree(suite, n):
    stage_line(suite, f"passed on {n} ranks, 1 node(s)")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_allreduce_training_equals_single_process_sgd_and_replicas_agree(suite, n):
    stage_line(suite, f"passed on {n} ranks, all-reduce {'shared' if n > 1 else 'none'}")


# ring_train's gradient is 105 floats: on one node ``auto`` takes the window's gather
# schedule.  The same invariant through its reduce-scatter, and through messages only
# (recursive doubling), in the suite's 3-rank stages; the ring, through both variables
# (PSGD_X_ALLREDUCE_*: read at import), in a launch of its own.
@pytest.mark.parametrize("algorithm", ["shared", "doubling"],
                         ids=["shared-reduce-scatter", "doubling"])
def test_allreduce_training_invariant_holds_for_every_algorithm(suite, algorithm):
    stage_line(suite, f"passed on 3 ranks, all-reduce {algorithm}")
    if algorithm == "shared":     # the 3-rank stage of the default settings and this one
        assert suite.stdout.count("passed on 3 ranks, all-reduce shared") == 2, suite.stdout


def test_allreduce_training_by_the_ring_when_the_variables_say_so(mpirun):
    result = mpirun(3, ["ring_train.py"], timeout=90, env={
        "PSGD_X_ALLREDUCE_SHARED_BYTES": "0", "PSGD_X_ALLREDUCE_SMALL_BYTES": "0"})
    assert "passed on 3 ranks, all-reduce ring" in result.stdout


def test_rank_waiting_in_ring_allreduce_for_late_neighbour_does_not_spin(suite):
    stage_line(suite, "ring_idle: passed")
    for run in ("doubling n=100", "ring n=1048576", "shared n=100", "shared n=1048576"):
        stage_line(suite, run)
    for waits_for in ("rank 1 (all-reduce recursive doubling)",
                      "rank 1 (ring all-reduce, left neighbour)",
                      "rank 1 (shared-memory all-reduce)"):
        assert re.search(r"psgd: rank 0 stalled: waiting \d+ s for " + re.escape(waits_for),
                         suite.stderr), suite.stderr


def test_the_suite_ran_every_stage(suite):
    stage_line(suite, "ring_suite: done")
    assert suite.returncode == 0, suite.stderr[-4000:]


def test_training_without_room_for_the_shared_window_ends_with_one_clear_error(mpirun, dataset):
    """The window cannot be had (here: a piece size no /dev/shm can hold): every rank stops at
    the first all-reduce with a message naming the window and the way round it."""
    proc = mpirun(2, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--model",
                      "mlp:784-16-10", "--protocol", "allreduce", "--steps", "2"],
                  env={"PSGD_X_ALLREDUCE_PIECE_BYTES": str(10 ** 14)}, check=False, timeout=60)
    assert proc.returncode != 0
    assert "shared-memory window (unable to allocate shared memory)" in proc.stderr, proc.stderr
    assert "PSGD_X_ALLREDUCE_SHARED_BYTES=0" in proc.stderr
    assert "Traceback" not in proc.stderr


# Emulated nodes (no namespace needed): MPICH puts rank r on clique r mod K and goes between
# cliques over TCP; ``auto`` then takes the hierarchical all-reduce, and ``shared`` is left out.
CLIQUES = {"FI_PROVIDER": "tcp", "MPICH_CH4_NETMOD": "ofi"}


@pytest.fixture(scope="module")
def two_nodes():
    """ring_check, ring_train and ring_idle in one launch of 4 ranks on 2 emulated nodes."""
    return run_mpi(4, ["ring_suite.py", "--whole"], timeout=300, check=False,
                   env={**CLIQUES, "MPIR_CVAR_NUM_CLIQUES": "2"})


def test_allreduce_across_two_emulated_nodes_matches_mpi_allreduce(two_nodes):
    stage_line(two_nodes, "passed on 4 ranks, 2 node(s)")


def test_allreduce_across_three_emulated_nodes_matches_mpi_allreduce(mpirun):
    result = mpirun(5, ["ring_check.py"], timeout=120,
                    env={**CLIQUES, "MPIR_CVAR_NUM_CLIQUES": "3"})
    assert "passed on 5 ranks, 3 node(s)" in result.stdout


def test_rank_waiting_in_pipelined_hierarchical_allreduce_does_not_spin(two_nodes):
    """Rank 0 leads node 0; the leaders' ring of its first chunk waits for late rank 1."""
    stage_line(two_nodes, "hierarchical n=1048576: waited")
    assert "rank 1 (ring all-reduce, left neighbour)" in two_nodes.stderr, two_nodes.stderr


def test_allreduce_training_across_emulated_nodes_takes_the_hierarchical_allreduce(two_nodes):
    stage_line(two_nodes, "passed on 4 ranks, all-reduce hierarchical")
    assert two_nodes.returncode == 0, two_nodes.stderr[-4000:]


def test_pipelined_chunks_per_buffer_size_and_leader_count():
    from psgd.collectives.hierarchical_pipeline import chunk_count
    assert chunk_count(4 << 20, 1 << 20, 2, 256 << 10) == 16
    assert chunk_count(100, 25, 2, 256 << 10) == 1          # under one chunk: not pipelined
    assert chunk_count(400, 100, 3, 1) == 33                # an element per leader per chunk
    assert chunk_count(8, 2, 3, 1) == 1
