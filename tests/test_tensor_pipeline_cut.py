"""The cut of a pipeline of tensor-split stages: its units' costs and its parts' memory are the
split layers' (psgd.tensor.pipeline), checked against the arrays a split stage allocates."""
from types import SimpleNamespace

import numpy as np
import pytest

from psgd.nn.model import model_layers
from psgd.pipeline import partition
from psgd.pipeline.options import PipelineOptions
from psgd.tensor import pipeline as tp
from psgd.tensor.conv import split_tensor
from psgd.tensor.model import TensorModel

CONV_BN = "conv:8x3:pad1-bn-relu-pool:2-conv:6x3:pad1-relu-gap-dense:10"
MLP = "mlp:20-16-15-12-10"   # widths 15 and 10: uneven over 2 and 3 parts


def serial(spec, shape):
    layers, ishape, classes = model_layers(spec, 0, shape, 10)
    return layers, ishape, classes, partition.units(SimpleNamespace(layers=layers, spec=spec))


def allocated(spec, ishape, classes, span, part, parts):
    """The stage part's own parameters, as a split stage allocates them (psgd.tensor.model)."""
    return TensorModel(spec, lambda layers, c: split_tensor(layers, c, close=True),
                       tp.PartComm(part, parts), input_shape=ishape, n_classes=classes, span=span)


@pytest.mark.parametrize("spec,shape", [(MLP, None), (CONV_BN, (3, 8, 8))])
@pytest.mark.parametrize("parts", [2, 3])
def test_part_bytes_of_every_stage_are_what_the_split_stage_allocates(spec, shape, parts):
    """For every contiguous span of units: each part's estimated parameter bytes equal the
    arrays its split stage allocates, and those are the replicated part plus the part's own
    share of the split weights, the shares summing to the serial split weights."""
    layers, ishape, classes, bounds = serial(spec, shape)
    for i in range(len(bounds)):
        for j in range(i + 1, len(bounds) + 1):
            span = (bounds[i][0], bounds[j - 1][1])
            est = tp.part_param_bytes(layers[span[0]:span[1]], parts, 4)
            models = [allocated(spec, ishape, classes, span, t, parts) for t in range(parts)]
            assert est == [m.params.nbytes for m in models], span
            own = [sum(int((p.kinds == 0).sum()) * p.width for p in m.pieces) for m in models]
            shared = [m.n_params - o for m, o in zip(models, own)]
            assert len(set(shared)) == 1, span   # the replicated part: the same on every part
            whole = sum(int(np.prod(s)) for layer in layers[span[0]:span[1]]
                        for _, s in layer.param_shapes())
            assert sum(own) + shared[0] == whole, span
            assert max(own) - min(own) <= whole // parts + 1, span


def test_split_profile_counts_the_parts_arrays():
    """profile_split times the split layers: the units' parameter and output bytes are part 0's
    (a column conv's output holds its channels only), each unit's input the whole activation."""
    layers, ishape, classes, bounds = serial(CONV_BN, (3, 8, 8))
    costs = tp.profile_split(layers, bounds, 2, 4, np.float32, repeats=1)
    whole = allocated(CONV_BN, ishape, classes, None, 0, 2)
    assert sum(c.param_bytes for c in costs) == whole.params.nbytes
    assert [type(layer).__name__ for layer in layers[:2]] == ["ChannelsLast", "Conv2D"]
    assert costs[1].in_bytes == 4 * 3 * 8 * 8 * 4
    assert costs[1].out_bytes == 4 * 8 * 8 * 4 * 4   # conv 8 filters -> 4 on part 0 of 2
    assert costs[2].in_bytes == 4 * 8 * 8 * 8 * 4     # the whole activation, not the part's
    assert all(c.seconds > 0 for c in costs)


def test_split_cut_fits_a_cap_only_the_split_parts_fit(dataset):
    """--memory-per-rank under --tensor 2: the cut counts each part's bytes, so a cap below the
    unsplit first unit's bytes (which refused before) still cuts, and every stage of the cut
    fits by the allocated arrays."""
    from psgd.run.pipeline_job import _cut
    spec, parts, micro = "mlp:784-256-256-10", 2, 16
    layers, ishape, classes, bounds = serial(spec, None)
    skeleton = SimpleNamespace(layers=layers, spec=spec, dtype=np.dtype(np.float32),
                               input_shape=ishape)
    unsplit = 4 * sum(int(np.prod(s)) for _, s in layers[0].param_shapes())
    cap = 2 * unsplit   # under 3 x the first unit's unsplit bytes, over 3 x its part's
    settings = SimpleNamespace(model=spec, data=dataset, seed=0, batch_size=micro,
                               split=SimpleNamespace(tensor=parts, grid=None, dtype="float32"))
    opts = PipelineOptions(stages=2, memory_per_rank=cap, recompute=True, schedule="gpipe")
    counts, costs, _ = _cut(settings, opts, skeleton)
    edges = np.cumsum([0, *counts])
    for s, (i, j) in enumerate(zip(edges[:-1], edges[1:])):
        span = (bounds[i][0], bounds[j - 1][1])
        part = max(allocated(spec, ishape, classes, span, t, parts).params.nbytes
                   for t in range(parts))
        inputs = micro * int(np.prod(layers[span[0]].in_shape)) * 4   # one microbatch in flight
        assert 3 * part + inputs + sum(c.out_bytes for c in costs[i:j]) <= cap
    with pytest.raises(ValueError, match="no cut into 2 stages split over 2 parts fits"):
        _cut(settings, PipelineOptions(stages=2, memory_per_rank=3 * unsplit // parts // 2,
                                       recompute=True, schedule="gpipe"), skeleton)


def test_split_cut_balances_the_split_costs():
    """best_split_cut minimises the slowest stage of the split units' times (brute force over
    every cut of made-up costs)."""
    layers, _, _, bounds = serial(MLP, None)
    rng = np.random.default_rng(1)
    costs = [partition.UnitCost(float(s), 80, 60, 100, 0.0) for s in rng.uniform(1, 5, len(bounds))]
    counts = tp.best_split_cut(costs, layers, bounds, 2, 4, 2, lambda s: 1)
    slowest = lambda c: max(sum(x.seconds for x in costs[:c[0]]),  # noqa: E731
                            sum(x.seconds for x in costs[c[0]:]))
    assert slowest(counts) == min(slowest([k, len(bounds) - k]) for k in range(1, len(bounds)))
