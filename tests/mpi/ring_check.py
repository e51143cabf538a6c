"""Checks ring_allreduce against comm.Allreduce for many lengths, dtypes, ops and algorithms."""

import numpy as np
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.ring import ring_allreduce

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
MPI_OPS = {"sum": MPI.SUM}


def lengths():
    base = {0, 1, 2, 3, size - 1, size, size + 1, 7, 13, 97, 4099, 65537, 1_000_003}
    return sorted(n for n in base if n >= 0)


def check_case(n, dtype, op, algorithm, segment_bytes=None):
    rng = np.random.default_rng(1000 * rank + n)
    x = rng.standard_normal(n).astype(dtype)
    expect = x.copy()
    comm.Allreduce(MPI.IN_PLACE, expect, op=MPI.SUM)
    absum = np.abs(x)
    comm.Allreduce(MPI.IN_PLACE, absum, op=MPI.SUM)
    if op == "mean":
        expect /= size
        absum /= size
    got = x.copy()
    out = ring_allreduce(comm, got, op, algorithm=algorithm, segment_bytes=segment_bytes)
    assert out is got
    eps = np.finfo(dtype).eps
    err = np.abs(got - expect)
    bound = 2 * size * eps * absum + np.finfo(dtype).tiny
    where = f"n={n} {np.dtype(dtype).name} {op} {algorithm} seg={segment_bytes}"
    assert np.all(err <= bound), f"{where}: max error {err.max()} over round-off"
    first = got.copy()
    comm.Bcast(first, root=0)
    assert np.array_equal(got, first), f"{where}: ranks disagree"


def check_validation():
    cases = [
        (np.zeros((4, 2), np.float32), "sum", "1-D"),
        (np.zeros(8, np.float32)[::2], "sum", "contiguous"),
        (np.zeros(8, np.int32), "sum", "float32 or float64"),
        (np.zeros(8, np.float16), "sum", "float32 or float64"),
        (np.zeros(8, ">f4"), "sum", "float32 or float64"),
        (np.zeros(8, np.float32), "max", "unknown all-reduce op"),
        ([1.0, 2.0], "sum", "numpy array"),
    ]
    ro = np.zeros(8, np.float32)
    ro.flags.writeable = False
    cases.append((ro, "sum", "read-only"))
    for buf, op, words in cases:
        try:
            ring_allreduce(comm, buf, op)
        except ValueError as exc:
            assert words in str(exc), f"message {exc!r} lacks {words!r}"
        else:
            raise AssertionError(f"no ValueError for {words}")


def check_plan_cache():
    """Schedules (persistent requests) are cached per buffer object: a buffer used again with
    new values, more buffers than the cache holds, and a fresh view each call all reduce right."""
    from psgd import ring
    bufs = [np.empty(n, np.float32) for n in (1, 3, 1000, 1000, 4099)]
    bufs += [np.empty(7, np.float64) for _ in range(ring._SCHEDULES)]
    base = np.empty(3000, np.float32)
    rng = np.random.default_rng(rank)
    for round_ in range(3):
        for buf in bufs + [base[:1500], base[1500:]]:
            buf[:] = rng.standard_normal(buf.size)
            expect = buf.copy()
            comm.Allreduce(MPI.IN_PLACE, expect, op=MPI.SUM)
            ring_allreduce(comm, buf, algorithm="doubling")
            err = np.abs(buf - expect).max(initial=0.0)
            assert err <= 1e-5 * size, f"cached plan, round {round_}, n={buf.size}: error {err}"
    cached = len(ring._state(comm).schedules)
    assert cached == (ring._SCHEDULES if size > 1 else 0), f"{cached} schedules cached"


def main():
    check_validation()
    check_plan_cache()
    count = 0
    for dtype in (np.float32, np.float64):
        for op in ("sum", "mean"):
            for n in lengths():
                for algorithm in ("auto", "ring", "doubling"):
                    if algorithm == "doubling" and n > 100_000:
                        continue        # auto already takes the ring there; keep the run short
                    check_case(n, dtype, op, algorithm)
                    count += 1
            for n in (size + 1, 1009, 20011):
                check_case(n, dtype, op, "ring", segment_bytes=64)
                count += 1
    # a sub-communicator gets its own state and tag space; freeing it frees its plans
    sub = comm.Split(rank % 2, rank)
    members = [r for r in range(size) if r % 2 == rank % 2]
    for algorithm in ("ring", "doubling"):
        x = np.full(5000, float(rank), np.float64)
        ring_allreduce(sub, x, "sum", algorithm=algorithm)
        assert np.all(x == sum(members)), f"sub-communicator {algorithm} sum wrong"
    sub.Free()
    if rank == 0:
        print(f"ring_check: {count} cases passed on {size} ranks")


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - one failing rank ends the job
        report_and_abort(exc)
