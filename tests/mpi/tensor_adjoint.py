"""Adjoint test <F x, y> = <x, F* y> in float64 for every primitive of psgd.tensor.primitives.

Replicated spaces use one copy's inner product, distributed ones the sum over ranks,
root ones rank 0's.  Prints one line per primitive on rank 0; a mismatch raises.
"""
import numpy as np
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.tensor import primitives as pr

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
SHARED = np.random.default_rng(1234)            # the same draws on every rank: replicated values
LOCAL = np.random.default_rng(99 + rank)         # this rank's own draws: distributed values
TOL = 1e-12


def dot(a, b, space):
    local = float(np.vdot(a, b)) if a is not None else 0.0
    if space == "replicated":
        return local
    if space == "root":
        return comm.bcast(local, root=0)
    return comm.allreduce(local)


def check(name, fx, y, x, fty, x_space, y_space):
    lhs, rhs = dot(fx, y, y_space), dot(x, fty, x_space)
    err = abs(lhs - rhs) / max(abs(lhs), 1e-300)
    if not err < TOL:
        raise AssertionError(f"{name}: <Fx,y>={lhs!r} <x,F*y>={rhs!r} relative error {err:.3g}")
    if rank == 0:
        print(f"adjoint ok {name} ranks={size} rel={err:.2e}", flush=True)


def main():
    sizes = pr.split_sizes(7 * size + 3, size)            # uneven when size > 1
    mine = sizes[rank]
    x = SHARED.normal(size=(5, 3))
    y = LOCAL.normal(size=(5, 3))
    check("copy", pr.copy_forward(x, comm), y, x, pr.copy_adjoint(y, comm), "replicated", "distributed")
    x, y = LOCAL.normal(size=(4, 6)), SHARED.normal(size=(4, 6))
    check("allreduce", pr.allreduce_forward(x, comm), y, x, pr.allreduce_adjoint(y, comm),
          "distributed", "replicated")
    x, y = LOCAL.normal(size=(mine, 2, 3)), SHARED.normal(size=(sum(sizes), 2, 3))
    check("allgather", pr.allgather_forward(x, comm, sizes), y, x, pr.allgather_adjoint(y, comm, sizes),
          "distributed", "replicated")
    x, y = SHARED.normal(size=(sum(sizes), 4)), LOCAL.normal(size=(mine, 4))
    check("split", pr.split_forward(x, comm, sizes), y, x, pr.split_adjoint(y, comm, sizes),
          "replicated", "distributed")
    x, y = LOCAL.normal(size=(sum(sizes), 3)), LOCAL.normal(size=(mine, 3))
    check("reduce_scatter", pr.reduce_scatter_forward(x, comm, sizes), y, x,
          pr.reduce_scatter_adjoint(y, comm, sizes), "distributed", "distributed")
    x = SHARED.normal(size=(sum(sizes), 2)) if rank == 0 else None
    y = LOCAL.normal(size=(mine, 2))
    check("scatter", pr.scatter_forward(x, comm, sizes, (2,), np.float64), y, x,
          pr.scatter_adjoint(y, comm, sizes), "root", "distributed")
    x = LOCAL.normal(size=(mine, 2))
    y = SHARED.normal(size=(sum(sizes), 2)) if rank == 0 else None
    check("gather", pr.gather_forward(x, comm, sizes), y, x, pr.gather_adjoint(y, comm, sizes, (2,), np.float64),
          "distributed", "root")
    lo = [0] + [min(2, sizes[r - 1]) for r in range(1, size)]
    hi = [min(3, sizes[r + 1]) for r in range(size - 1)] + [0]
    x = LOCAL.normal(size=(mine, 5, 2))
    y = LOCAL.normal(size=(lo[rank] + mine + hi[rank], 5, 2))
    check("halo", pr.halo_forward(x, comm, lo, hi), y, x, pr.halo_adjoint(y, comm, lo, hi),
          "distributed", "distributed")


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - one failing rank ends the job
        report_and_abort(exc)
