"""Split models against serial: logits, input gradient, parameter gradients, SGD steps and
evaluation (batch-norm calibration included) through the parts.

Usage: tensor_split_check.py — checks an MLP split Megatron-style (uneven widths) and conv
nets split by height (pad, stride, pool, BN; gathered where a part would be thinner than
the kernel) and by channels, residual blocks split both ways, --grid auto's mixes (dropout
on samples included, a spatial head), on COMM_WORLD, in float64 and float32.
"""
from functools import partial

import numpy as np
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.kernels.loss import softmax_cross_entropy
from psgd.nn.model import build_model
from psgd.nn.optim import make_optimizer
from psgd.tensor.conv import split_tensor
from psgd.tensor.dense import split_dense_chain
from psgd.tensor.mixed import split_mixed
from psgd.tensor.model import TensorModel
from psgd.tensor.spatial import SpatialWindow, split_spatial

comm = MPI.COMM_WORLD
TOL = {np.float64: 1e-12, np.float32: 1e-5}
# after 3 float32 steps a ReLU or max-pool tie can flip under another summation order (LeNet
# on 4 ranks: one conv's gradient moves 2e-3 at step 3), so the steps get a looser bound
# there; float64 checks them to 1e-12
STEPS_TOL = {np.float64: 1e-12, np.float32: 1e-3}
SPATIAL_MIX = "conv:16x3:pad1-relu-conv:16x3:pad1-relu-pool:4-flatten-dense:1024-relu-dense:10"
CASES = [("mlp:23-13-7-5", split_dense_chain, None),
         ("mlp:17-9-4", split_dense_chain, None),
         ("conv:4x3:pad1-bn-relu-pool:2-conv:6x3:s2:pad1-relu-flatten-dense:5", split_spatial, (2, 40, 11)),
         ("lenet", split_spatial, None),
         ("lenet", split_tensor, None),
         ("conv:6x3:pad1-bn-relu-pool:2-conv:5x3:s2-relu-conv:7x3:pad1-bn-relu-gap-dense:9-relu-dense:5",
          split_tensor, (3, 12, 12)),
         # the projection block's 10 filters split unevenly over 3 and 4 ranks
         ("conv:8x3:pad1-bn-relu-res:8-res:10:s2-gap-dense:5", split_tensor, (3, 12, 12)),
         ("conv:8x3:pad1-bn-relu-res:8-res:12:s2-gap-dense:5", split_spatial, (3, 24, 8)),
         # 6 rows after the stride-2 block: split 3 or 4 ways thinner than its 3x3 convs,
         # so the rows are gathered before it and it runs whole
         ("conv:4x3:pad1-bn-relu-res:4-res:6:s2-res:6-gap-dense:5", split_spatial, (2, 12, 5)),
         # --grid auto's mixes: the layers before the cut on each rank's samples, the rest split
         ("conv:6x3:pad1-bn-relu-pool:2-flatten-dense:9-relu-dense:5", partial(split_mixed, cut=5), (2, 8, 8)),
         ("conv:6x3:pad1-bn-relu-pool:2-flatten-dense:9-relu-dense:5", partial(split_mixed, cut=2), (2, 8, 8)),
         ("conv:6x3:pad1-bn-relu-pool:2-flatten-dense:9-relu-dense:5", partial(split_mixed, cut=7), (2, 8, 8)),
         ("conv:8x3:pad1-bn-relu-res:8-res:10:s2-gap-dense:5", partial(split_mixed, cut=4), (3, 12, 12)),
         # a dropout on each rank's samples draws the serial masks (its rows of the whole batch's)
         ("conv:6x3:pad1-relu-dropout:0.5-pool:2-flatten-dense:9-relu-dense:5", partial(split_mixed, cut=4), (2, 8, 8)),
         # spatial then tensor: the convs on each rank's rows (halos), gathered at the flatten,
         # the dense layers split (what --grid auto picks for 3 samples of 64x64 on 2 ranks)
         (SPATIAL_MIX, partial(split_mixed, cut=6, head="spatial"), (3, 64, 64))]


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def chain(layers, x, y, dtype):
    """Forward and backward through ``layers`` (input gradient included): logits, dx."""
    for layer in layers:
        layer.set_mode("train")
        x = layer.forward(x)
    logits = x.copy()
    dy = np.empty(x.shape, dtype)
    softmax_cross_entropy(x, y, dy)
    for layer in reversed(layers):
        dy = layer.backward(dy, need_dx=True)
    return logits, dy


def check(spec, split, shape, dtype):
    serial = build_model(spec, seed=3, dtype=dtype, input_shape=shape, n_classes=5)
    tm = TensorModel(spec, split, comm, seed=3, dtype=dtype, input_shape=shape, n_classes=5)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(6, *serial.input_shape)).astype(dtype)
    y = rng.integers(0, serial.n_classes, 6)
    serial.reseed(7)
    tm.reseed(7)
    ref_logits, ref_dx = chain(serial.layers, x, y, dtype)
    logits, dx = chain(tm.layers, x, y, dtype)
    if tm.partial.size:
        tm.grad[tm.partial] = comm.allreduce(tm.grad[tm.partial])
    errs = {"forward": rel(logits, ref_logits), "input grad": rel(dx, ref_dx),
            "weight grad": whole(tm, tm.grad, serial.grad)}
    opt_s, opt_t = make_optimizer("momentum", serial.n_params), make_optimizer("momentum", tm.n_params)
    for step in range(3):
        xb, yb = rng.normal(size=x.shape).astype(dtype), rng.integers(0, serial.n_classes, 6)
        serial.loss_and_grad(xb, yb)
        tm.loss_and_grad(xb, yb)
        opt_s.step(serial.params, serial.grad, 0.05)
        opt_t.step(tm.params, tm.grad, 0.05)
    errs["3 steps"] = whole(tm, tm.params, serial.params)
    errs["evaluate"] = evaluate(tm, serial, rng, dtype)
    once = max(v for k, v in errs.items() if k != "3 steps")
    line = ", ".join(f"{k} {v:.1e}" for k, v in errs.items())
    if not (once <= TOL[dtype] and errs["3 steps"] <= STEPS_TOL[dtype]):
        raise AssertionError(f"{spec} {np.dtype(dtype).name} on {comm.size} ranks: {line}")
    if comm.rank == 0:
        print(f"split ok {spec} {np.dtype(dtype).name} ranks={comm.size}: {line}", flush=True)


def whole(tm, local, ref):
    """The parts of ``local`` gathered on rank 0 against the serial ``ref`` (0 elsewhere)."""
    full = tm.gather_flat(local)
    return rel(full, ref) if comm.rank == 0 else 0.0


def evaluate(tm, serial, rng, dtype):
    """Test loss (and accuracy, exactly) through the parts against the serial model's, with
    batch-norm statistics from the same calibration samples, in batches of 4 of 13 samples."""
    cal = rng.normal(size=(9, *serial.input_shape)).astype(dtype)
    x, y = rng.normal(size=(13, *serial.input_shape)).astype(dtype), rng.integers(0, serial.n_classes, 13)
    serial.set_calibration(cal)
    tm.set_calibration(cal)
    (loss, acc), (ref_loss, ref_acc) = tm.evaluate(x, y, batch_size=4), serial.evaluate(x, y, batch_size=4)
    if dtype == np.float64 and acc != ref_acc:
        raise AssertionError(f"accuracy through the parts {acc}, serial {ref_acc}")
    return abs(loss - ref_loss) / abs(ref_loss)


def refuses_thin_slabs():
    """A first conv (5x5 on 6 rows) that cannot be split by height at all: one clear ValueError."""
    try:
        TensorModel("conv:3x5-relu-flatten-dense:5", split_spatial, comm, input_shape=(1, 6, 9), n_classes=5)
    except ValueError as exc:
        if comm.rank == 0:
            print(f"refused ok ranks={comm.size}: {exc}", flush=True)
        return
    raise AssertionError(f"a 5x5 conv on 6 rows split {comm.size} ways by height was not refused")


def gathers_where_too_thin():
    """LeNet's second conv (5x5 on 14 rows) split 3 or 4 ways would be thinner than its kernel:
    the rows are gathered before it, so only the first conv and pool stay split."""
    tm = TensorModel("lenet", split_spatial, comm)
    windows = sum(isinstance(layer, SpatialWindow) for layer in tm.layers)
    if windows != (4 if comm.size <= 2 else 2):   # conv, pool (and conv, pool) split
        raise AssertionError(f"lenet split {comm.size} ways keeps {windows} layers split by height")


def main():
    if comm.size > 1:
        refuses_thin_slabs()
    gathers_where_too_thin()
    for spec, split, shape in CASES:
        for dtype in (np.float64, np.float32):
            check(spec, split, shape, dtype)


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - one failing rank ends the job
        report_and_abort(exc)
