"""Stage-local allocation: each stage's model holds its own slice of the parameters only,
drawn as the whole model draws them."""
import numpy as np
import pytest

from psgd.nn.model import build_model
from psgd.pipeline import partition
from psgd.pipeline.local import StageModel

MODELS = [("mlp:20-30-30-30-10", {}), ("lenet", {}),
          ("resnet8", {"input_shape": (3, 8, 8), "n_classes": 10})]


def even(n: int, k: int) -> list[int]:
    return [n // k + (s < n % k) for s in range(k)]


@pytest.mark.parametrize("spec,kw", MODELS)
@pytest.mark.parametrize("k", [2, 3, 4])
def test_stage_models_tile_the_whole_model_and_hold_only_their_slice(spec, kw, k):
    whole = build_model(spec, seed=5, **kw)
    bounds = partition.layer_bounds(whole, even(len(partition.units(whole)), k))
    parts = []
    for a, b in bounds:
        stage = StageModel(spec, a, b, seed=5, **kw)
        share = sum(int(np.prod(s)) for layer in whole.layers[a:b]
                    for _, s in layer.param_shapes())
        assert stage.n_params == share < whole.n_params and stage.n_total == whole.n_params
        assert stage.params.nbytes + stage.grad.nbytes == 2 * share * whole.dtype.itemsize
        assert np.array_equal(stage.params, whole.params[stage.offset:stage.offset + share])
        parts.append(stage.params)
    assert np.array_equal(np.concatenate(parts), whole.params)


def test_a_stage_computes_the_whole_models_gradient_slice():
    spec = "mlp:12-16-16-10"
    whole, rng = build_model(spec, seed=2, dtype=np.float64), np.random.default_rng(0)
    x, y = rng.standard_normal((8, 12)), rng.integers(0, 10, 8)
    whole.loss_and_grad(x, y)
    first, last = StageModel(spec, 0, 1, seed=2, dtype=np.float64), \
        StageModel(spec, 1, 3, seed=2, dtype=np.float64)
    h = first.layers[0].forward(x)
    for layer in last.layers[1:3]:
        h = layer.forward(h)
    last._loss(h, y)
    dy = last._dlogits
    for i in (2, 1):
        dy = last.layers[i].backward(dy)
    first.layers[0].backward(dy, need_dx=False)
    assert np.array_equal(np.concatenate([first.grad, last.grad]), whole.grad)


def test_profiling_one_unit_at_a_time_measures_the_same_units():
    spec = "mlp:20-30-30-30-10"
    whole, skeleton = build_model(spec), StageModel(spec, 0, 0)
    assert skeleton.n_params == 0 and skeleton.n_total == whole.n_params
    full = partition.profile(whole, 4, repeats=1)
    local = partition.profile(skeleton, 4, repeats=1, unit_model=lambda a, b: StageModel(spec, a, b))
    strip = lambda cs: [(c.in_bytes, c.out_bytes, c.param_bytes) for c in cs]  # noqa: E731
    assert strip(local) == strip(full)
