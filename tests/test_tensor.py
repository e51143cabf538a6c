"""Model parallelism inside a layer: the primitives' adjoint tests and split layers against serial."""
from types import SimpleNamespace

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
    be split at all is refused; --grid auto's batch-then-tensor mixes at three cuts, one
    with a dropout on the samples (its masks the serial ones), and a spatial-then-tensor mix."""
    out = mpirun(n, ["tensor_split_check.py"], timeout=180).stdout
    assert out.count("split ok") == 30, out
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


NO_FLAGS = SimpleNamespace(bandwidth=None, latency_us=None, per_node=None)


def _plan_allreduce(net, ranks, group, nbytes, cliques=None):
    """psgd plan's all-reduce of ``nbytes`` among ``group`` of ``ranks`` on ``net`` (a list of
    groups: all of them at once)."""
    from psgd.plan.cost import Job, groups_allreduce_s
    groups = group if isinstance(group[0], list) else [group]
    return groups_allreduce_s(Job(max(1, int(nbytes // 4)), 0.0, 1, ranks, cliques=cliques), groups, net)


def test_grid_auto_runs_a_conv_trunk_on_samples_and_splits_the_wide_dense_head():
    """Gholami's integrated choice on a conv trunk with a wide head: neither pure batch (cut at
    the end: every weight all-reduced) nor pure tensor (cut 0: every activation all-reduced)
    is cheapest; the pure-batch cost is psgd plan's all-reduce of each layer's weights and
    of half the logits (an all-gather), on psgd plan's default network, counted here by hand."""
    from psgd.nn.model import model_layers
    from psgd.plan.cost import Network
    from psgd.run.grid_cost import pricer
    from psgd.tensor import mixed
    spec = "conv:8x3:pad1-relu-conv:8x3:pad1-relu-pool:2-flatten-dense:2048-relu-dense:10"
    layers = model_layers(spec, 0, (1, 28, 28), 10)[0]
    price, line = pricer(NO_FLAGS, 2, 2, environ={})
    cut, costs = mixed.choose_cut(layers, FakeComm(0, 2), 32, 4, price)
    names = [type(layer).__name__ for layer in layers]
    assert 0 < cut < len(layers) and costs[cut] == min(c for c in costs if c is not None)
    assert costs[cut] < min(costs[0], costs[-1])
    assert "Conv2D" in names[:cut] and "Dense" not in names[:cut]
    assert line == "10 Gbit/s, 20 us per message, 1 rank(s) per node"
    net = Network(10e9 / 8, 20e-6)
    weights = [sum(int(np.prod(s)) for _, s in layer.param_shapes()) for layer in layers if layer.param_shapes()]
    batch = sum(_plan_allreduce(net, 2, [0, 1], 4 * n) for n in weights) \
        + _plan_allreduce(net, 2, [0, 1], 32 * 10 * 4 / 2)
    assert costs[-1] == pytest.approx(batch, rel=1e-12)


def test_grid_auto_prices_on_psgd_nets_link_and_adds_the_replicas_all_reduce():
    """Under psgd net (PSGD_X_NET) the group's collectives cross its one shared link, rank r
    on node r mod N, with the other replicas' groups at once; a flag wins over it; with D
    replicas each cut adds the all-reduce of this rank's parameters across them (ranks 0, T,
    2T..., every part's replicas at once), as psgd plan prices it."""
    from psgd.nn.model import model_layers
    from psgd.plan.cost import Network
    from psgd.run.grid_cost import pricer
    from psgd.tensor import mixed
    env = {"PSGD_X_NET": "1000000000,2"}
    price, line = pricer(NO_FLAGS, 4, 2, environ=env)
    assert line == "1 Gbit/s, 20 us per message, psgd net's 2 nodes, one shared link"
    shared = Network(1e9 / 8, 20e-6, shared=True)
    for kind, nbytes, group in [("all-reduce", 1e6, [[0, 1], [2, 3]]), ("all-gather", 1e6, [[0, 1], [2, 3]]),
                                ("replica all-reduce", 3e5, [[0, 2], [1, 3]])]:
        reduced = nbytes / 2 if kind == "all-gather" else nbytes
        assert price(kind, nbytes) == pytest.approx(_plan_allreduce(shared, 4, group, reduced, 2), rel=1e-12)
    assert price("all-reduce", 1e6) > 5 * pricer(NO_FLAGS, 4, 2, environ={})[0]("all-reduce", 1e6)
    flagged = SimpleNamespace(bandwidth="100gbit", latency_us=5.0, per_node=None)
    assert pricer(flagged, 4, 2, environ=env)[1].startswith("100 Gbit/s, 5 us per message, psgd net")
    layers = model_layers("mlp:64-32-32-10", 0, (64,), 10)[0]
    alone = mixed.choose_cut(layers, FakeComm(0, 2), 16, 4, price)[1]
    both = mixed.choose_cut(layers, FakeComm(0, 2), 16, 4, price, replicas=2)[1]
    for cut, (a, b) in enumerate(zip(alone, both)):
        held = mixed.local_values(mixed.split_mixed(layers, FakeComm(0, 2), cut))
        assert b == pytest.approx(a + price("replica all-reduce", 4 * held), rel=1e-12)


def test_the_copies_asp_shares_under_grid_auto_are_the_layers_on_samples():
    """Under asp/ssp the group takes part 0's values of its copies each step: the indices are
    exactly the conv's parameters (on samples) and the row-parallel last layer's bias (held
    whole by both parts), a hand count; none of the split weights."""
    from psgd.run.tensor_rank import copies
    from psgd.tensor.mixed import split_mixed
    from psgd.tensor.model import TensorModel
    spec = "conv:4x3:pad1-relu-pool:2-flatten-dense:64-relu-dense:10"
    model = TensorModel(spec, lambda layers, comm: split_mixed(layers, comm, 3), FakeComm(0, 2),
                        input_shape=(1, 28, 28), n_classes=10)
    index = copies(model)
    bias = model.n_params - 10                # the last layer's, at the end of the local vector
    assert np.array_equal(index, np.r_[np.arange(4 * 9 + 4), np.arange(bias, bias + 10)])


def test_grid_auto_prices_a_spatial_head_and_picks_it_for_big_images_on_few_samples():
    """Gholami's integrated choice with spatial: 3 samples of 64x64 on 2 ranks (a batch split
    leaves one rank 2 of 3 samples) put the convs on each rank's rows and split the dense
    head by tensor; a halo is psgd plan's neighbour exchange of the kernel's rows (counted
    here by hand: each part sends its neighbour the row it needs); at 16 samples the batch
    head wins (even shares, no halos)."""
    from psgd.nn.model import model_layers
    from psgd.plan.cost import Job, Network, Traffic
    from psgd.plan.grid import choose_split, group_price
    from psgd.tensor.mixed import split_mixed, step_seconds
    from psgd.tensor.spatial import SpatialWindow
    spec = "conv:16x3:pad1-relu-conv:16x3:pad1-relu-pool:4-flatten-dense:1024-relu-dense:10"
    layers, net = model_layers(spec, 0, (3, 64, 64), 10)[0], Network(10e9 / 8, 20e-6)
    price = group_price(net, 1, None, 2, 2)
    head, cut, rows = choose_split(layers, FakeComm(0, 2), 3, 4, price)
    names = [type(layer).__name__ for layer in layers]
    assert (head, cut) == ("spatial", names.index("Flatten"))
    assert choose_split(layers, FakeComm(0, 2), 16, 4, price)[0] == "batch"
    split = split_mixed(layers, FakeComm(0, 2), cut, head)
    first = [la for la in split if isinstance(la, SpatialWindow)][0]
    assert first.hi[0] == first.lo[1] == 1 and first.lo[0] == first.hi[1] == 0   # 3x3, pad 1
    halo, row = Traffic(Job(1, 0.0, 1, 2, 0, 1, None)), 3 * 64 * 3 * 4
    for a, b in ((0, 1), (1, 0)):         # one row of 64 pixels x 3 channels, 3 samples, float32
        halo.carry(a, b, row)             # each way, one message each
    assert price("halo", np.array([[row, row]])) == pytest.approx(halo.seconds(net, 1), rel=1e-12)
    assert price("halo", np.array([[0, 0]])) == 0.0
    chosen = next(r for r in rows if (r["head"], r["cut"]) == (head, cut))
    assert chosen["collective_s"] == pytest.approx(step_seconds(split, 3, 4, price), rel=1e-12)


@pytest.mark.parametrize("cut, head", [(21, "batch"), (5, "batch"), (0, "batch"), (5, "spatial")])
def test_a_group_of_one_rank_runs_the_serial_layers_not_their_split_wrappers(cut, head):
    """T = 1 (plain --grid auto picking D x 1, --grid D,1): every split is the identity, so the
    group runs the serial layers and kernels (the split ones, batch norm's float64 numpy above
    all, made the grid path's steps slower than the allreduce protocol's); the model has no
    partial gradient to all-reduce."""
    from mpi4py import MPI

    from psgd.nn.model import model_layers
    from psgd.tensor.conv import split_tensor
    from psgd.tensor.mixed import split_mixed
    from psgd.tensor.model import TensorModel
    layers = model_layers("cifar-cnn", 0, None, None)[0]
    assert split_mixed(layers, MPI.COMM_SELF, cut, head) == layers
    assert split_tensor(layers, MPI.COMM_SELF) == layers
    model = TensorModel("cifar-cnn", lambda ls, c: split_mixed(ls, c, cut, head), MPI.COMM_SELF)
    assert model.partial.size == 0 and model.n_params == model.n_total
