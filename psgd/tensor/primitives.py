"""The communication primitives of model parallelism, each a forward beside its adjoint.

Spaces: a *replicated* array is one logical value held by every rank of ``comm``
(its inner product is one copy's); a *distributed* array is one value per rank
(its inner product sums over ranks); a *root* array lives on rank 0 only.  Every
pair satisfies <F x, y> = <x, F* y> in these inner products (tests/mpi/tensor_adjoint.py).
Splits are along axis 0 in ``sizes`` (:func:`split_sizes`); non-blocking calls are
completed as psgd's all-reduce completes its own (:mod:`psgd.collectives.schedules`): a
short yield spin, since the partners are inside the same call, then backoff sleeps.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from psgd.collectives.schedules import complete, complete_all
from psgd.mpi import timeline

HALO_TAG = 7150


SPENT: dict[str, float] = {}   # seconds waited on each kind of collective, since the start


def wait(request, what, kind: str = "other") -> None:
    """Complete one posted request, its wait counted in :data:`SPENT` under ``kind``; under
    ``--timeline`` it is a "collective" span."""
    t0 = time.perf_counter()
    complete(request, what)
    _spent(kind, t0)


def waitall(requests: list, what, kind: str = "halo") -> None:
    """Complete posted requests (a halo exchange), as :func:`wait`."""
    t0 = time.perf_counter()
    complete_all(requests, what)
    _spent(kind, t0)


def _spent(kind: str, t0: float) -> None:
    t1 = time.perf_counter()
    SPENT[kind] = SPENT.get(kind, 0.0) + (t1 - t0)
    if timeline.current is not None:
        timeline.current.span("collective", t0, t1)


def split_sizes(n: int, parts: int) -> list[int]:
    """Lengths of ``parts`` near-equal pieces of ``n`` (the first ``n % parts`` one longer)."""
    base, extra = divmod(int(n), int(parts))
    return [base + (r < extra) for r in range(parts)]


def split_bounds(n: int, parts: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of piece ``rank`` of :func:`split_sizes`."""
    sizes = split_sizes(n, parts)
    lo = sum(sizes[:rank])
    return lo, lo + sizes[rank]


def _row(x: np.ndarray) -> int:
    return int(np.prod(x.shape[1:], dtype=np.int64))


def _mpi_type(x: np.ndarray):
    return MPI._typedict[x.dtype.char]


# -- copy / all-reduce ----------------------------------------------------------------------
def copy_forward(x: np.ndarray, comm) -> np.ndarray:
    """Replicated -> distributed: every rank keeps its copy (no message)."""
    return x


def copy_adjoint(dy: np.ndarray, comm) -> np.ndarray:
    """Distributed -> replicated: the sum over ranks (an all-reduce)."""
    return allreduce_forward(dy, comm)


def allreduce_forward(x: np.ndarray, comm) -> np.ndarray:
    """Distributed -> replicated: the sum over ranks, as a new array."""
    x = np.ascontiguousarray(x)
    out = np.empty_like(x)
    if comm.Get_size() == 1:
        out[...] = x
        return out
    wait(comm.Iallreduce([x, _mpi_type(x)], [out, _mpi_type(out)], MPI.SUM),
         "the tensor group's all-reduce", "all-reduce")
    return out


def allreduce_adjoint(dy: np.ndarray, comm) -> np.ndarray:
    """Replicated -> distributed: each rank's part of the gradient is the whole (a copy)."""
    return dy


# -- all-gather / split -----------------------------------------------------------------------
def allgather_forward(x: np.ndarray, comm, sizes: list[int]) -> np.ndarray:
    """Distributed slices (rank r holds ``sizes[r]`` rows) -> replicated concatenation."""
    x = np.ascontiguousarray(x)
    out = np.empty((sum(sizes), *x.shape[1:]), x.dtype)
    counts = [s * _row(x) for s in sizes]
    displs = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
    wait(comm.Iallgatherv([x, _mpi_type(x)], [out, (counts, displs), _mpi_type(x)]),
         "the tensor group's all-gather", "all-gather")
    return out


def allgather_adjoint(dy: np.ndarray, comm, sizes: list[int]) -> np.ndarray:
    """Replicated -> distributed: this rank's rows of ``dy`` (the split)."""
    lo = sum(sizes[:comm.Get_rank()])
    return dy[lo:lo + sizes[comm.Get_rank()]]


split_forward = allgather_adjoint
split_adjoint = allgather_forward


# -- reduce-scatter / all-gather of the parts --------------------------------------------------
def reduce_scatter_forward(x: np.ndarray, comm, sizes: list[int]) -> np.ndarray:
    """Distributed whole arrays -> distributed slices: rank r gets rows ``sizes[r]`` of the sum."""
    x = np.ascontiguousarray(x)
    out = np.empty((sizes[comm.Get_rank()], *x.shape[1:]), x.dtype)
    counts = [s * _row(x) for s in sizes]
    wait(comm.Ireduce_scatter([x, _mpi_type(x)], [out, _mpi_type(x)], counts, MPI.SUM),
         "the tensor group's reduce-scatter", "reduce-scatter")
    return out


def reduce_scatter_adjoint(dy: np.ndarray, comm, sizes: list[int]) -> np.ndarray:
    """Distributed slices -> distributed whole arrays: each rank gets the concatenation."""
    return allgather_forward(dy, comm, sizes)


# -- scatter / gather -------------------------------------------------------------------------
def scatter_forward(x: np.ndarray | None, comm, sizes: list[int], shape: tuple, dtype) -> np.ndarray:
    """Root -> distributed: rank r gets rows ``sizes[r]`` of rank 0's ``x`` (per-row ``shape``)."""
    out = np.empty((sizes[comm.Get_rank()], *shape), dtype)
    row = int(np.prod(shape, dtype=np.int64))
    counts = [s * row for s in sizes]
    displs = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
    send = [np.ascontiguousarray(x), (counts, displs), _mpi_type(out)] if comm.Get_rank() == 0 else None
    wait(comm.Iscatterv(send, [out, _mpi_type(out)], root=0), "the tensor group's scatter", "scatter")
    return out


def scatter_adjoint(dy: np.ndarray, comm, sizes: list[int]) -> np.ndarray | None:
    """Distributed -> root: the gather (None off rank 0)."""
    return gather_forward(dy, comm, sizes)


def gather_forward(x: np.ndarray, comm, sizes: list[int]) -> np.ndarray | None:
    """Distributed slices -> root: rank 0 gets the concatenation (None elsewhere)."""
    x = np.ascontiguousarray(x)
    root = comm.Get_rank() == 0
    out = np.empty((sum(sizes), *x.shape[1:]), x.dtype) if root else None
    counts = [s * _row(x) for s in sizes]
    displs = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
    recv = [out, (counts, displs), _mpi_type(x)] if root else None
    wait(comm.Igatherv([x, _mpi_type(x)], recv, root=0), "the tensor group's gather", "gather")
    return out


def gather_adjoint(dy: np.ndarray | None, comm, sizes: list[int], shape: tuple, dtype):
    """Root -> distributed: the scatter."""
    return scatter_forward(dy, comm, sizes, shape, dtype)


# -- halo exchange ----------------------------------------------------------------------------
def halo_forward(x: np.ndarray, comm, lo: list[int], hi: list[int]) -> np.ndarray:
    """Distributed slabs -> distributed extended slabs along axis 0.

    Rank r's result is the last ``lo[r]`` rows of rank r-1's slab, its own slab, then
    the first ``hi[r]`` rows of rank r+1's (``lo[0]`` and ``hi[-1]`` must be 0).
    """
    r, p = comm.Get_rank(), comm.Get_size()
    x = np.ascontiguousarray(x)
    n = x.shape[0]
    out = np.empty((lo[r] + n + hi[r], *x.shape[1:]), x.dtype)
    out[lo[r]:lo[r] + n] = x
    reqs = []
    if lo[r]:
        reqs.append(comm.Irecv(out[:lo[r]], r - 1, HALO_TAG))
    if hi[r]:
        reqs.append(comm.Irecv(out[lo[r] + n:], r + 1, HALO_TAG))
    if r + 1 < p and lo[r + 1]:
        reqs.append(comm.Isend(x[n - lo[r + 1]:], r + 1, HALO_TAG))
    if r > 0 and hi[r - 1]:
        reqs.append(comm.Isend(x[:hi[r - 1]], r - 1, HALO_TAG))
    waitall(reqs, "a neighbour's halo rows")
    return out


def halo_adjoint(dy: np.ndarray, comm, lo: list[int], hi: list[int]) -> np.ndarray:
    """Distributed extended slabs -> distributed slabs: the halo rows' gradients go back to
    the ranks that own those rows and are added to them."""
    r, p = comm.Get_rank(), comm.Get_size()
    dy = np.ascontiguousarray(dy)
    n = dy.shape[0] - lo[r] - hi[r]
    dx = dy[lo[r]:lo[r] + n].copy()
    from_next = np.empty((lo[r + 1] if r + 1 < p else 0, *dy.shape[1:]), dy.dtype)
    from_prev = np.empty((hi[r - 1] if r > 0 else 0, *dy.shape[1:]), dy.dtype)
    reqs = []
    if lo[r]:
        reqs.append(comm.Isend(dy[:lo[r]], r - 1, HALO_TAG + 1))
    if hi[r]:
        reqs.append(comm.Isend(dy[lo[r] + n:], r + 1, HALO_TAG + 1))
    if from_next.shape[0]:
        reqs.append(comm.Irecv(from_next, r + 1, HALO_TAG + 1))
    if from_prev.shape[0]:
        reqs.append(comm.Irecv(from_prev, r - 1, HALO_TAG + 1))
    waitall(reqs, "a neighbour's halo gradients")
    if from_next.shape[0]:
        dx[n - from_next.shape[0]:] += from_next
    if from_prev.shape[0]:
        dx[:from_prev.shape[0]] += from_prev
    return dx
