"""A pipeline's parameters after some steps against the serial reference (tests/test_pipeline_mpi.py).

Usage: pipeline_check.py SPEC K M SCHEDULE STEPS [DTYPE] [OPTIMIZER]; ranks = D x K (D = 1
for pipedream).
Rank 0 prints ``max |pipeline - serial| = X`` (exactly 0 expected for D = 1) and
each stage's peak stored inputs.
"""
import sys

import numpy as np
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.nn.model import build_model
from psgd.pipeline.evaluate import evaluate
from psgd.pipeline.local import StageModel
from psgd.nn.optim import make_optimizer
from psgd.pipeline.grid import Grid
from psgd.pipeline.options import PipelineOptions
from psgd.pipeline.partition import layer_bounds, units
from psgd.pipeline.asynchronous import Microbatches
from psgd.pipeline.pipemare import default_anneal
from psgd.pipeline.reference import reference_pipedream, reference_pipemare, reference_step
from psgd.pipeline.trainer import build_trainer

SHAPE = {"lenet": (1, 28, 28)}
BATCH = 16


def batches(model, steps, replicas):
    rng = np.random.default_rng(7)
    shape = (steps, replicas, BATCH, *model.input_shape)
    return (rng.standard_normal(shape).astype(model.dtype),
            rng.integers(0, model.n_classes, (steps, replicas, BATCH)))


def even_counts(n, k):
    return [n // k + (i < n % k) for i in range(k)]


def main():
    spec, k, m, schedule, steps = sys.argv[1], *map(int, sys.argv[2:4]), sys.argv[4], int(sys.argv[5])
    dtype = np.dtype(sys.argv[6] if len(sys.argv) > 6 else "float32")
    opt = sys.argv[7] if len(sys.argv) > 7 else "momentum"
    comm = MPI.COMM_WORLD
    grid = Grid(comm, k)
    make = lambda: build_model(spec, seed=3, dtype=dtype, input_shape=SHAPE.get(spec, (3, 8, 8)),
                               n_classes=10)
    whole = make()
    options = PipelineOptions(stages=k, microbatches=m, schedule=schedule)
    bounds = layer_bounds(whole, even_counts(len(units(whole)), k))
    # this rank allocates its stage's parameters only
    model = StageModel(spec, *bounds[grid.stage], seed=3, dtype=dtype,
                       input_shape=SHAPE.get(spec, (3, 8, 8)), n_classes=10)
    assert model.n_params < whole.n_params or k == 1
    del whole
    trainer = build_trainer(model, grid, options, bounds, lambda n: make_optimizer(opt, n),
                            BATCH, steps)
    xs, ys = batches(model, steps, grid.replicas)
    if schedule in ("pipedream", "pipemare"):   # the steps as one schedule of steps x M microbatches
        trainer.run(steps * m, lambda g: 0.05, Microbatches(lambda t: xs[t, grid.replica], m),
                    Microbatches(lambda t: ys[t, grid.replica], m))
    else:
        for t in range(steps):
            trainer.step(t, 0.05, model._check_x(xs[t, grid.replica]), ys[t, grid.replica])
    trainer.links.finish()
    parts = grid.row_comm.gather(trainer.stage.params.copy(), root=0)   # replica's stages in order
    params = np.concatenate(parts) if parts is not None else None
    test_x, test_y = (a[:, 0].reshape(-1, *a.shape[3:]) for a in batches(model, 2, 1))
    result = evaluate(model, grid, (test_x, test_y), test_x[:40] if model.any_batchnorm else None)
    peaks = np.zeros(comm.Get_size(), np.int64)
    comm.Gather(np.array([trainer.stage.peak_inputs], np.int64), peaks)
    if comm.Get_rank() == 0:
        ref = make()
        ropt = make_optimizer(opt, ref.n_params)
        b = BATCH // m
        micro = (xs[:, 0].reshape(steps * m, b, *model.input_shape), ys[:, 0].reshape(steps * m, b))
        if schedule == "pipedream":
            reference_pipedream(ref, ropt, *micro, bounds, lambda g: 0.05)
        if schedule == "pipemare":
            reference_pipemare(ref, lambda n: make_optimizer(opt, n), *micro, bounds,
                               lambda g: 0.05, anneal=default_anneal(steps * m), correct=True)
        for t in range(steps if schedule not in ("pipedream", "pipemare") else 0):
            if grid.replicas == 1:
                reference_step(ref, ropt, xs[t, 0], ys[t, 0], m, 0.05)
            else:  # D replicas: the serial step on all D x M microbatches
                reference_step(ref, ropt, xs[t].reshape(-1, *model.input_shape), ys[t].reshape(-1),
                               m * grid.replicas, 0.05)
        diff = float(np.max(np.abs(params.astype(np.float64) - ref.params)))
        print(f"max |pipeline - serial| = {diff!r}")
        print(f"peak inputs per stage = {peaks[:k].tolist()}")
        ref.set_calibration(test_x[:40])
        print(f"streamed evaluation equal = {result == ref.evaluate(test_x, test_y)}")
        print(f"moved = {float(np.max(np.abs(ref.params - make().params)))!r}")
    grid.free()


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:   # noqa: BLE001
        report_and_abort(exc)
