"""The spatial split's batch norm: its float32/float64 kernels against the unsplit layer and
finite differences, the group's statistics combined from shifted parts, its memory."""
import numpy as np
import pytest


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_spatial_batch_norm_matches_the_unsplit_layer_and_finite_differences(mpirun, n):
    """Forward, input gradient, gamma and beta gradients on uneven rows, with and without the
    ReLU, float64 to 1e-12 and float32 to 1e-6 relative; central differences in float64."""
    out = mpirun(n, ["spatial_bn_check.py"], timeout=120).stdout
    assert out.count("bn ok") == 7, out


def _parts(x, sizes):
    """(P, 1 + 3C) rows of :func:`batchnorm_shifted_sums` for ``x`` (rows, C) cut into ``sizes``."""
    from psgd.kernels.batchnorm import batchnorm_shifted_sums
    c, out, lo = x.shape[1], [], 0
    for size in sizes:
        row = np.zeros(1 + 3 * c)
        row[0] = size
        batchnorm_shifted_sums(np.ascontiguousarray(x[lo:lo + size]), row[1:c + 1], row[c + 1:2 * c + 1],
                               row[2 * c + 1:])
        out.append(row)
        lo += size
    return np.array(out)


@pytest.mark.parametrize("sizes", [[40], [13, 0, 27], [1, 1, 38], [20, 20]])
def test_the_groups_moments_from_shifted_parts_equal_the_whole_batchs(sizes):
    """Mean and variance of float32 rows far from zero (1e4 + N(0, 1)): combined from the
    parts (one part empty, one a single row) as the whole batch's in float64, to 1e-12."""
    from psgd.tensor.spatial import group_moments
    x = (1e4 + np.random.default_rng(0).normal(size=(40, 5))).astype(np.float32)
    n, mean, m2 = group_moments(_parts(x, sizes))
    ref = x.astype(np.float64)
    assert n == 40
    np.testing.assert_allclose(mean, ref.mean(0), rtol=1e-14)
    np.testing.assert_allclose(m2 / n, ref.var(0), rtol=1e-12)


def test_spatial_batch_norm_in_float32_holds_no_float64_activations_and_equals_the_unsplit_layer():
    """Float32 on a group of one: the split layer keeps the same arrays as the unsplit one
    (input, output, gradient; arrays of a few channels' size not counted), no float64
    copies of the activations, and
    its output is the unsplit layer's bit for bit."""
    from mpi4py import MPI

    from psgd.nn.norm import BatchNorm
    from psgd.tensor.spatial import SpatialBatchNorm
    shape, c = (6, 5, 8), 8
    serial = BatchNorm(shape, relu=True)
    part = SpatialBatchNorm(serial, shape, MPI.COMM_SELF)
    x = np.random.default_rng(1).normal(size=(16, *shape)).astype(np.float32)
    outs = []
    for layer in (serial, part):
        layer.bind({"gamma": np.ones(c, np.float32), "beta": np.zeros(c, np.float32)},
                   {"gamma": np.zeros(c, np.float32), "beta": np.zeros(c, np.float32)})
        layer.set_mode("train")
        outs.append(layer.forward(x).copy())
        layer.backward(x)
    held = [[v for v in [*vars(layer).values(), *layer._bufs.values()]
             if isinstance(v, np.ndarray) and v.size > 4 * c] for layer in (serial, part)]
    assert sum(v.nbytes for v in held[1]) <= sum(v.nbytes for v in held[0])
    assert not [v.shape for v in held[1] if v.dtype != np.float32]
    np.testing.assert_array_equal(outs[1], outs[0])
