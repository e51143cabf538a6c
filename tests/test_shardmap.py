"""The shard map covers the vector exactly, in near-equal contiguous ranges."""
import numpy as np
import pytest

from psgd.shardmap import ShardMap


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
