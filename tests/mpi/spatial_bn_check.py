"""SpatialBatchNorm on COMM_WORLD against the unsplit BatchNorm on the whole batch (forward,
input gradient, gamma and beta gradients; float64 and float32; uneven rows, with and without
its ReLU) and against central differences of the group's loss in float64.

Usage: spatial_bn_check.py — prints "bn ok ..." per case on rank 0.
"""
import numpy as np
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.nn.norm import BatchNorm
from psgd.tensor.primitives import split_bounds
from psgd.tensor.spatial import SpatialBatchNorm

comm = MPI.COMM_WORLD
# float64: round-off only; float32: the same float32 kernels as the unsplit layer, the
# statistics and the gradient sums in float64 over other groupings, so a few float32 ulps
TOL = {np.float64: 1e-12, np.float32: 1e-6}


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def layers(rows, c, relu, dtype):
    serial = BatchNorm((rows, 5, c), relu=relu)
    lo, hi = split_bounds(rows, comm.size, comm.rank)
    part = SpatialBatchNorm(serial, (hi - lo, 5, c), comm)
    rng = np.random.default_rng(11)
    gamma, beta = rng.normal(size=c).astype(dtype), rng.normal(size=c).astype(dtype)
    for layer in (serial, part):
        g = {"gamma": np.zeros(c, dtype), "beta": np.zeros(c, dtype)}
        layer.bind({"gamma": gamma.copy(), "beta": beta.copy()}, g)
        layer.set_mode("train")
    return serial, part, (lo, hi)


def against_serial(rows, c, relu, dtype, offset):
    """Rows of (batch, rows, 5, c) images split over the ranks, values ``offset`` + N(0, 1)."""
    serial, part, (lo, hi) = layers(rows, c, relu, dtype)
    rng = np.random.default_rng(3)
    x = (offset + rng.normal(size=(4, rows, 5, c))).astype(dtype)
    dy = rng.normal(size=x.shape).astype(dtype)
    ref_out, ref_dx = serial.forward(x).copy(), serial.backward(dy).copy()
    out = part.forward(np.ascontiguousarray(x[:, lo:hi]))
    dx = part.backward(np.ascontiguousarray(dy[:, lo:hi]))
    sl = (slice(None), slice(lo, hi))
    errs = {"forward": rel(out, ref_out[sl]), "dx": rel(dx, ref_dx[sl]),
            "dgamma": rel(part.dgamma, serial.dgamma), "dbeta": rel(part.dbeta, serial.dbeta)}
    worst = comm.allreduce(max(errs.values()), MPI.MAX)
    line = f"rows={rows} relu={relu} {np.dtype(dtype).name} offset={offset:g} ranks={comm.size}: " + \
        ", ".join(f"{k} {v:.1e}" for k, v in errs.items())
    if out.dtype != dtype or dx.dtype != dtype or worst > TOL[dtype]:
        raise AssertionError(line)
    if comm.rank == 0:
        print(f"bn ok {line}", flush=True)


def finite_differences(rows=7, c=3, h=1e-6):
    """d/dx, d/dgamma, d/dbeta of the group's loss sum(w * out) (w fixed, each rank its rows)
    by central differences, one entry per rank of x and every gamma and beta entry."""
    _, part, (lo, hi) = layers(rows, c, True, np.float64)
    rng = np.random.default_rng(5)
    x = np.ascontiguousarray(rng.normal(size=(3, rows, 5, c))[:, lo:hi])
    w = np.ascontiguousarray(rng.normal(size=(3, rows, 5, c))[:, lo:hi])

    def loss():
        return comm.allreduce(float((w * part.forward(x)).sum()))

    loss()
    dx = part.backward(w).copy()
    dgamma, dbeta = part.dgamma.copy(), part.dbeta.copy()
    worst = 0.0
    idx = (1, min(1, x.shape[1] - 1), 2, 1)
    for q in range(comm.size):                       # rank q moves one of its entries
        here = comm.rank == q and x.shape[1] > 0
        diffs = []
        for sign in (1, -1):
            if here:
                x[idx] += sign * h
            diffs.append(loss())
            if here:
                x[idx] -= sign * h
        if here:
            fd = (diffs[0] - diffs[1]) / (2 * h)
            worst = max(worst, abs(fd - dx[idx]) / max(abs(dx[idx]), 1e-3))
    for p, grad in ((part.gamma, dgamma), (part.beta, dbeta)):   # replicated: every rank moves it
        for j in range(c):
            p[j] += h
            up = loss()
            p[j] -= 2 * h
            down = loss()
            p[j] += h
            worst = max(worst, abs((up - down) / (2 * h) - grad[j]) / max(abs(grad[j]), 1e-3))
    worst = comm.allreduce(worst, MPI.MAX)
    if worst > 1e-6:
        raise AssertionError(f"finite differences: worst relative error {worst:.1e} on {comm.size} ranks")
    if comm.rank == 0:
        print(f"bn ok finite differences ranks={comm.size}: {worst:.1e}", flush=True)


def main():
    for dtype in (np.float64, np.float32):
        for rows, relu, offset in ((9, False, 0.0), (7, True, 0.0), (5, True, 1e3)):
            against_serial(rows, 4, relu, dtype, offset)
    finite_differences()


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - one failing rank ends the job
        report_and_abort(exc)
