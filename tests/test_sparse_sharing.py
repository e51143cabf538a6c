"""bench/sparse_sharing.py's replay: rows one worker wrote that the other then touches."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from sparse_sharing import batches, line_transfer_ns, shared_rows  # noqa: E402


def test_a_row_counts_when_the_other_worker_wrote_it_since_this_one_touched_it():
    # w0 writes rows 0 and 1, w1 then row 0 (moved), w0 row 0 again (moved), w1 row 2 (new)
    work = [[np.array([0, 1]), np.array([0])], [np.array([0]), np.array([2])]]
    assert shared_rows(work, np.zeros(3, bool)) == 2 / 4
    # a worker touching its own last write again moves nothing
    own = [[np.array([1]), np.array([1])], [np.array([2]), np.array([2])]]
    assert shared_rows(own, np.zeros(3, bool)) == 0.0


def test_held_rows_are_not_counted():
    work = [[np.array([0, 1]), np.array([0])], [np.array([0]), np.array([2])]]
    assert shared_rows(work, np.array([True, False, False])) == 0.0


def test_batches_are_the_distinct_features_of_each_batch_and_the_bias_row():
    indptr = np.array([0, 2, 3, 5, 6])
    indices = np.array([4, 1, 1, 0, 4, 2])
    got = batches(indptr, indices, np.arange(4), batch=2, steps=2, bias=9)
    assert [b.tolist() for b in got] == [[1, 4, 9], [0, 2, 4, 9]]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0),
                    reason="needs CPUs 0 and 1")
def test_line_transfer_hands_the_line_back_and_forth_and_restores_the_affinity():
    before = os.sched_getaffinity(0)
    ns = line_transfer_ns(rounds=2000)
    assert 0 < ns < 1e6
    assert os.sched_getaffinity(0) == before
