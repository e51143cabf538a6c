"""Checks allreduce against comm.Allreduce for many lengths, dtypes, ops and algorithms.

Under ``MPIR_CVAR_NUM_CLIQUES`` (emulated nodes) the window-only algorithm ``shared`` is
left out; the hierarchical all-reduce and ``auto`` (which then picks it) are checked instead.
"""

import time

import numpy as np
from mpi4py import MPI

from psgd.collectives.allreduce import allreduce
from psgd.errors import report_and_abort

MPI_OPS = {"sum": MPI.SUM}


def one_node(c):
    node = c.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == c.Get_size()
    finally:
        node.Free()


def use(c):
    """Check on communicator ``c`` (COMM_WORLD, or one of ring_suite.py's sub-communicators)."""
    global comm, rank, size, ONE_NODE, ALGORITHMS
    comm, rank, size = c, c.Get_rank(), c.Get_size()
    ONE_NODE = one_node(comm)
    ALGORITHMS = ("auto", "ring", "doubling", "hierarchical") + (("shared",) if ONE_NODE else ())


use(MPI.COMM_WORLD)


def lengths():
    base = {0, 1, 2, 3, size - 1, size, size + 1, 7, 13, 97, 4099, 65537, 1_000_003}
    return sorted(n for n in base if n >= 0)


def check_case(n, dtype, op, algorithm, segment_bytes=None, small_bytes=None, chunk_bytes=None):
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
    out = allreduce(comm, got, op, algorithm=algorithm, segment_bytes=segment_bytes,
                    small_bytes=small_bytes, chunk_bytes=chunk_bytes)
    assert out is got
    eps = np.finfo(dtype).eps
    err = np.abs(got - expect)
    bound = 2 * size * eps * absum + np.finfo(dtype).tiny
    where = (f"n={n} {np.dtype(dtype).name} {op} {algorithm} seg={segment_bytes} "
             f"small={small_bytes} chunk={chunk_bytes}")
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
            allreduce(comm, buf, op)
        except ValueError as exc:
            assert words in str(exc), f"message {exc!r} lacks {words!r}"
        else:
            raise AssertionError(f"no ValueError for {words}")


def check_plan_cache():
    """Schedules (persistent requests) are cached per buffer object: a buffer used again with
    new values, more buffers than the cache holds, and a fresh view each call all reduce right."""
    from psgd.collectives import allreduce as ring
    bufs = [np.empty(n, np.float32) for n in (1, 3, 1000, 1000, 4099)]
    bufs += [np.empty(7, np.float64) for _ in range(ring._SCHEDULES)]
    base = np.empty(3000, np.float32)
    rng = np.random.default_rng(rank)
    for round_ in range(3):
        for buf in bufs + [base[:1500], base[1500:]]:
            buf[:] = rng.standard_normal(buf.size)
            expect = buf.copy()
            comm.Allreduce(MPI.IN_PLACE, expect, op=MPI.SUM)
            ring.allreduce(comm, buf, algorithm="doubling")
            err = np.abs(buf - expect).max(initial=0.0)
            assert err <= 1e-5 * size, f"cached plan, round {round_}, n={buf.size}: error {err}"
    cached = len(ring._state(comm).schedules)
    assert cached == (ring._SCHEDULES if size > 1 else 0), f"{cached} schedules cached"


def check_shared_rounds(rounds=300):
    """Back-to-back all-reduces of buffers of many sizes, by every algorithm in a random order,
    with ranks delayed at random between calls: the window's two halves must keep a rank
    that runs ahead from writing where a slower one still reads.  Values are small integers,
    so every sum is exact and the expected result is known without another collective."""
    from psgd.collectives import allreduce as ring
    order = np.random.default_rng(7)              # the same sequence of calls on every rank
    delay = np.random.default_rng(100 + rank)     # rank-specific timing
    bufs = {n: np.empty(n, np.float32) for n in (3, 100, 4096, 70_000, 300_000, 700_000)}
    for r in range(rounds):
        n = int(order.choice(list(bufs)))
        window = "shared" if ONE_NODE else "hierarchical"
        algorithm = str(order.choice([window, window, "ring", "doubling"]))
        small = int(order.choice([0, 1 << 30])) if algorithm == window else None
        chunk = int(order.choice([0, 65536, 1 << 20])) if algorithm == window else None
        base = order.integers(-50, 50, n).astype(np.float32)
        buf = bufs[n]
        np.multiply(base, rank + 1, out=buf)
        if delay.random() < 0.3:
            time.sleep(delay.random() * 2e-3)
        ring.allreduce(comm, buf, algorithm=algorithm, small_bytes=small, chunk_bytes=chunk)
        expect = base * (size * (size + 1) // 2)
        assert np.array_equal(buf, expect), (f"round {r}: n={n} {algorithm} small={small} "
                                             f"chunk={chunk} wrong")
    state = ring._state(comm)
    if not ONE_NODE:
        assert not state.one_node and state.layout.nodes > 1
        multi = state.layout.largest > 1
        for n in (3, 4096, 700_000):
            assert ring.auto_algorithm(comm, bufs[n]) == ("hierarchical" if multi else
                                                         "doubling" if n < 70_000 else "ring")
    elif size > 1:
        assert state.window is not None and state.one_node
        state.one_node = False                     # as if the ranks were on several nodes
        try:
            assert ring.auto_algorithm(comm, bufs[4096]) == "hierarchical"
            state.layout.largest = 1               # ... one rank on each
            assert ring.auto_algorithm(comm, bufs[4096]) == "doubling"
            assert ring.auto_algorithm(comm, bufs[700_000]) == "ring"
            try:
                ring.allreduce(comm, bufs[100], algorithm="shared")
            except ValueError as exc:
                assert "one node" in str(exc), exc
            else:
                raise AssertionError("no ValueError for 'shared' across nodes")
        finally:
            state.one_node, state.layout.largest = True, size
        assert ring.auto_algorithm(comm, bufs[700_000]) == "shared"
        big = np.empty(ring.DEFAULT_SHARED_BYTES // 4 + 1, np.float32)
        assert ring.auto_algorithm(comm, big) == "ring"
        assert ring.auto_algorithm(comm, bufs[700_000], shared_bytes=0) == "ring"
        assert ring.auto_algorithm(comm, bufs[4096], shared_bytes=0) == "doubling"


def check_pipelined(dtype):
    """The hierarchical all-reduce pipelined in chunks: odd lengths, fewer elements than
    chunks asked for, chunks of a few elements and of many ring segments; returns the count."""
    count = 0
    for op in ("sum", "mean"):
        for n in sorted({1, 2, 3, size - 1, size, size + 1, 7, 13, 97}):
            for chunk in (1, 8, 64):
                check_case(n, dtype, op, "hierarchical", chunk_bytes=chunk)
                count += 1
        for n in (4099, 65537, 300_007):
            check_case(n, dtype, op, "hierarchical", segment_bytes=4096, chunk_bytes=65536)
            check_case(n, dtype, op, "auto", small_bytes=0, chunk_bytes=4096 if n < 10 ** 5
                       else 1 << 17)
            count += 2
    return count


def main():
    check_validation()
    check_plan_cache()
    check_shared_rounds()
    count = 0
    for dtype in (np.float32, np.float64):
        for op in ("sum", "mean"):
            for n in lengths():
                for algorithm in ALGORITHMS:
                    if algorithm == "doubling" and n > 100_000:
                        continue        # auto already takes the ring there; keep the run short
                    check_case(n, dtype, op, algorithm)
                    count += 1
            for n in (size + 1, 1009, 20011):
                check_case(n, dtype, op, "ring", segment_bytes=64)
                # the window's two schedules at any size: reduce-scatter, and gather
                for window in ALGORITHMS[3:]:
                    check_case(n, dtype, op, window, small_bytes=0)
                    check_case(n, dtype, op, window, small_bytes=1 << 30)
                    count += 2
                count += 1
        if not ONE_NODE:
            count += check_pipelined(dtype)
    # a sub-communicator gets its own state and tag space; freeing it frees its plans
    sub = comm.Split(rank % 2, rank)
    members = [r for r in range(size) if r % 2 == rank % 2]
    for algorithm in ALGORITHMS[1:] if one_node(sub) else ALGORITHMS[1:4]:
        x = np.full(5000, float(rank), np.float64)
        allreduce(sub, x, "sum", algorithm=algorithm)
        assert np.all(x == sum(members)), f"sub-communicator {algorithm} sum wrong"
    sub.Free()
    if rank == 0:
        from psgd.collectives import allreduce as ring
        nodes = ring._state(comm).layout.nodes
        print(f"ring_check: {count} cases passed on {size} ranks, {nodes} node(s)")


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - one failing rank ends the job
        report_and_abort(exc)
