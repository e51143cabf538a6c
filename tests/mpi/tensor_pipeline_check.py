"""A pipeline of tensor-split stages against serial float64 (tests/test_tensor_pipeline.py).

Usage: tensor_pipeline_check.py SPEC K T M SCHEDULE STEPS [spatial CUT SIZE]; ranks = D x K x T.
With ``spatial``, the stages are split by rows over T parts (--spatial T), the model cut into
CUT units per stage (comma-separated), on SIZE x SIZE images of one channel.
Rank 0 prints ``relative |grid - serial| = X`` over the parameters after STEPS steps (the
serial step on the D x M microbatches of each batch; under pipedream and pipemare, D = 1, the
unsplit asynchronous pipeline's serial reference) and the same for the streamed test loss.
"""
import sys
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.nn.model import build_model
from psgd.nn.optim import make_optimizer
from psgd.pipeline.evaluate import evaluate
from psgd.pipeline.grid import TensorGrid
from psgd.pipeline.options import PipelineOptions
from psgd.pipeline.partition import layer_bounds, units
from psgd.pipeline.asynchronous import Microbatches
from psgd.pipeline.pipemare import default_anneal
from psgd.pipeline.reference import reference_pipedream, reference_pipemare, reference_step
from psgd.tensor.pipeline import build_trainer, stage_model

SHAPE = (3, 8, 8)
ASYNC = ("pipedream", "pipemare")
BATCH = 12


def main():
    spec, k, t, m, schedule, steps = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5], int(sys.argv[6])
    spatial = len(sys.argv) > 7 and sys.argv[7] == "spatial"
    global SHAPE
    SHAPE = (1, int(sys.argv[9]), int(sys.argv[9])) if spatial else SHAPE
    comm = MPI.COMM_WORLD
    grid = TensorGrid(comm, k, t)
    whole = build_model(spec, seed=3, dtype=np.float64, input_shape=SHAPE, n_classes=10)
    shape = whole.input_shape
    n = len(units(whole))
    cut = list(map(int, sys.argv[8].split(","))) if spatial else [n // k + (i < n % k) for i in range(k)]
    bounds = layer_bounds(whole, cut)
    settings = SimpleNamespace(model=spec, seed=3,
                               split=SimpleNamespace(dtype="float64", spatial=t if spatial else None))
    model = stage_model(settings, {"input_shape": SHAPE, "n_classes": 10}, *bounds[grid.stage],
                        grid.tensor_comm)
    options = PipelineOptions(stages=k, microbatches=m, schedule=schedule, recompute=True)
    trainer = build_trainer(model, grid, options,
                            lambda n: make_optimizer("momentum", n, dtype=np.float64), BATCH, steps)
    rng = np.random.default_rng(7)
    xs = rng.standard_normal((steps, grid.replicas, BATCH, *shape))
    ys = rng.integers(0, 10, (steps, grid.replicas, BATCH))
    if schedule in ASYNC:   # the steps as one schedule of steps x M microbatches
        trainer.run(steps * m, lambda g: 0.05, Microbatches(lambda s: model._check_x(xs[s, grid.replica]), m),
                    Microbatches(lambda s: ys[s, grid.replica], m))
    for step in range(0 if schedule in ASYNC else steps):
        trainer.step(step, 0.05, model._check_x(xs[step, grid.replica]), ys[step, grid.replica])
    trainer.links.finish()
    stage_flat = model.gather_flat(model.params)            # this stage's values, on part 0
    params = np.zeros(model.n_total) if comm.Get_rank() == 0 else None
    if grid.part == 0 and grid.replica == 0:
        grid.row_comm.Reduce(stage_flat, params, MPI.SUM, root=0)
    tx, ty = rng.standard_normal((40, *shape)), rng.integers(0, 10, 40)
    result = evaluate(model, grid, (tx, ty), tx[:24] if model.any_batchnorm else None)
    if comm.Get_rank() == 0:
        ref = build_model(spec, seed=3, dtype=np.float64, input_shape=SHAPE, n_classes=10)
        ropt = make_optimizer("momentum", ref.n_params, dtype=np.float64)
        b = BATCH // m   # pipedream, pipemare: the unsplit asynchronous pipeline's reference
        micro = (xs[:, 0].reshape(steps * m, b, *shape), ys[:, 0].reshape(steps * m, b))
        if schedule == "pipedream":
            reference_pipedream(ref, ropt, *micro, bounds, lambda g: 0.05)
        if schedule == "pipemare":
            reference_pipemare(ref, lambda n: make_optimizer("momentum", n, dtype=np.float64),
                               *micro, bounds, lambda g: 0.05, anneal=default_anneal(steps * m),
                               correct=True)
        for step in range(0 if schedule in ASYNC else steps):
            reference_step(ref, ropt, xs[step].reshape(-1, *shape), ys[step].reshape(-1),
                           m * grid.replicas, 0.05, key=(0, step))   # dropout: D = 1
        rel = float(np.max(np.abs(params - ref.params)) / np.max(np.abs(ref.params)))
        moved = float(np.max(np.abs(ref.params - build_model(
            spec, seed=3, dtype=np.float64, input_shape=SHAPE, n_classes=10).params)))
        ref.set_calibration(tx[:24])
        loss, _ = ref.evaluate(tx, ty)
        print(f"relative |grid - serial| = {rel!r}")
        print(f"test loss relative = {abs(result[0] - loss) / abs(loss)!r}")
        print(f"moved = {moved!r}")
        print(f"stage parameters = {model.n_params} of {model.n_total}")
    grid.free()


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:   # noqa: BLE001
        report_and_abort(exc)
