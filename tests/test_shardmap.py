"""The shard map covers the vector exactly, in near-equal contiguous ranges."""
import numpy as np
import pytest

from psgd.mpi.shardmap import ShardMap


@pytest.mark.parametrize("n", [0, 1, 2, 7, 100, 1001])
@pytest.mark.parametrize("shards", [1, 2, 3, 5])
def test_shards_partition_the_vector(n, shards):
    sm = ShardMap(n, shards)
    covered = np.concatenate([np.arange(*sm.range(s)) for s in range(shards)])
    np.testing.assert_array_equal(covered, np.arange(n))
    sizes = [sm.size(s) for s in range(shards)]
    assert max(sizes) - min(sizes) <= 1


def test_view_is_a_view():
    v = np.zeros(10, np.float32)
    ShardMap(10, 3).view(v, 1)[:] = 1
    assert v.tolist() == [0] * 4 + [1] * 3 + [0] * 3


def test_bad_shard_count():
    with pytest.raises(ValueError, match="at least one shard"):
        ShardMap(10, 0)


def test_own_takes_the_shard_or_slices_a_full_vector_and_names_a_wrong_length():
    smap = ShardMap(10, 3)                       # shards of 4, 3, 3
    full = np.arange(10, dtype=np.float64)
    assert np.array_equal(smap.own(full, 1), [4, 5, 6])
    assert smap.own(full, 1).dtype == np.float32
    assert np.array_equal(smap.own([7, 8, 9], 2), [7, 8, 9])
    with pytest.raises(ValueError, match="shard 0: initial shard has 3 values, expected 4 "
                                         r"\(or the full 10\)"):
        smap.own([1, 2, 3], 0, "initial shard")
    one = ShardMap(4, 1)                         # one shard: the full vector is the shard
    assert np.array_equal(one.own(np.ones(4), 0), np.ones(4))
