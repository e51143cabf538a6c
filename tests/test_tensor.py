"""Model parallelism inside a layer: the primitives' adjoint tests and split layers against serial."""
import numpy as np
import pytest

NAMES = ["copy", "allreduce", "allgather", "split", "reduce_scatter", "scatter", "gather", "halo"]


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_every_primitive_passes_the_adjoint_test_float64(mpirun, n):
    out = mpirun(n, ["tensor_adjoint.py"], timeout=120).stdout
    for name in NAMES:
        assert f"adjoint ok {name} ranks={n}" in out, out


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_split_layers_match_serial_forward_input_and_weight_gradients_and_steps(mpirun, n):
    """Megatron MLPs (uneven widths), conv nets split by height and by channels (an odd
    conv that gathers, uneven filters, BN), residual blocks split by channels and by height
    (a stride-2 block with its projection), float64 to 1e-12 and float32 to 1e-5 relative;
    by height, layers thinner than their kernel (LeNet's second conv above 2 ranks, a
    resnet's last block above 2) run whole on gathered rows, and a first conv that cannot
    be split at all is refused; --grid auto's batch-then-tensor mixes at three cuts."""
    out = mpirun(n, ["tensor_split_check.py"], timeout=180).stdout
    assert out.count("split ok") == 26, out
    assert (n == 1) or "refused ok" in out, out


class FakeComm:
    """A communicator's rank and size, for the checks that run before any message."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size


@pytest.mark.parametrize("n,parts", [(10, 3), (7, 7), (5, 1), (23, 4)])
def test_split_sizes_cover_the_width_and_differ_by_at_most_one(n, parts):
    from psgd.tensor.primitives import split_bounds, split_sizes
    sizes = split_sizes(n, parts)
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1
    assert [split_bounds(n, parts, r)[1] - split_bounds(n, parts, r)[0] for r in range(parts)] == sizes


def test_a_tensor_split_wider_than_a_layer_is_refused_in_one_line():
    from psgd.nn.model import build_model
    from psgd.tensor.dense import split_dense_chain
    from psgd.tensor.model import TensorModel
    with pytest.raises(ValueError, match=r"--tensor 8 is larger than dense layer 20->5 allows") as err:
        TensorModel("mlp:20-5-3", split_dense_chain, FakeComm(0, 8))
    assert "\n" not in str(err.value)


def test_spatial_on_a_model_without_conv_layers_is_refused():
    from psgd.tensor.model import TensorModel
    from psgd.tensor.spatial import split_spatial
    with pytest.raises(ValueError, match="--spatial needs a model with conv layers"):
        TensorModel("mlp:20-5-3", split_spatial, FakeComm(0, 2))


SPLITS = [("mlp:23-13-7-5", None, "tensor", [1, 2, 3, 4]),
          ("conv:6x3:pad1-bn-relu-pool:2-conv:5x3:s2-relu-conv:7x3:pad1-bn-relu-gap-dense:9-relu-dense:5",
           (3, 12, 12), "tensor", [2, 3]),
          ("conv:8x3:pad1-bn-relu-res:8-res:12:s2-gap-dropout:0.5-dense:5", (3, 16, 16), "tensor", [2, 4]),
          ("conv:4x3:pad1-bn-relu-pool:2-conv:6x3:s2:pad1-relu-flatten-dense:5", (2, 40, 11), "spatial", [2, 3]),
          ("conv:8x3:pad1-bn-relu-res:8-res:12:s2-gap-dense:5", (3, 24, 8), "spatial", [2, 4])]


@pytest.mark.parametrize("draw_values", [5, 1 << 20])
@pytest.mark.parametrize("spec, shape, axis, parts", SPLITS)
def test_each_part_draws_its_own_values_of_the_serial_draw_bit_equal(spec, shape, axis, parts, draw_values):
    """Every rank draws the model layer by layer (in blocks of ``draw_values``) and keeps its
    part: equal, bit for bit, to those values of the serial model's draw; over the ranks, each
    value is owned once (their owned blocks add up to the serial vector)."""
    import numpy as np

    from psgd.nn.model import build_model
    from psgd.tensor.conv import split_tensor
    from psgd.tensor.model import TensorModel
    from psgd.tensor.spatial import split_spatial
    split = split_tensor if axis == "tensor" else split_spatial
    for dtype in (np.float32, np.float64):
        serial = build_model(spec, seed=11, dtype=dtype, input_shape=shape, n_classes=5)
        for t in parts:
            total, count = np.zeros(serial.n_params, dtype), np.zeros(serial.n_params, np.int64)
            for rank in range(t):
                tm = TensorModel(spec, split, FakeComm(rank, t), seed=11, dtype=dtype, input_shape=shape,
                                 n_classes=5, draw_values=draw_values)
                index = tm.take_flat(lambda lo, hi: np.arange(lo, hi), dtype=np.int64)
                assert tm.n_total == serial.n_params and tm.params.dtype == dtype
                assert np.array_equal(tm.params.view(np.uint8), serial.params[index].view(np.uint8))
                assert np.array_equal(tm.take_flat(lambda lo, hi: serial.params[lo:hi]), tm.params)
                for lo, hi, block in tm.owned_blocks(tm.params):
                    total[lo:hi] += block
                for lo, hi, block in tm.owned_blocks(np.ones(tm.n_params, np.int64)):
                    count[lo:hi] += block
            assert np.array_equal(total, serial.params) and (count == 1).all(), (spec, t)


def test_grid_auto_runs_a_conv_trunk_on_samples_and_splits_the_wide_dense_head():
    """Gholami's integrated choice on a conv trunk with a wide head: neither pure batch (cut at
    the end: every weight all-reduced) nor pure tensor (cut 0: every activation all-reduced)
    is cheapest; the pure-batch cost is the alpha-beta all-reduce of each layer's weights and
    the all-gather of the logits, counted here by hand."""
    from psgd.nn.model import model_layers
    from psgd.tensor import mixed
    spec = "conv:8x3:pad1-relu-conv:8x3:pad1-relu-pool:2-flatten-dense:2048-relu-dense:10"
    layers = model_layers(spec, 0, (1, 28, 28), 10)[0]
    cut, costs = mixed.choose_cut(layers, FakeComm(0, 2), batch=32, itemsize=4)
    names = [type(layer).__name__ for layer in layers]
    assert 0 < cut < len(layers) and costs[cut] == min(c for c in costs if c is not None)
    assert costs[cut] < min(costs[0], costs[-1])
    assert "Conv2D" in names[:cut] and "Dense" not in names[:cut]
    a, b = mixed.LATENCY_S, mixed.SECONDS_PER_BYTE
    weights = [sum(int(np.prod(s)) for _, s in layer.param_shapes()) for layer in layers if layer.param_shapes()]
    batch = sum(2 * a + n * 4 * b for n in weights) + a + 32 * 10 * 4 * b / 2
    assert costs[-1] == pytest.approx(batch, rel=1e-12)
