"""psgd's own all-reduce: a pipelined ring (reduce-scatter then all-gather) and recursive doubling for small buffers."""
from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np
from mpi4py import MPI

from psgd import wait as _wait
from psgd.env import env_float, env_int

OPS = ("sum", "mean")
ALGORITHMS = ("auto", "ring", "doubling")

# Buffers of fewer bytes than this use recursive doubling (log2 N exchanges of the
# whole buffer); larger ones the ring (2(N-1) exchanges of 1/N of it each).  From
# bench/bench_allreduce.py --algorithm doubling|ring on 2 cores: at 2 ranks doubling
# was faster up to 256 KB, the ring from 1 MB; the alpha-beta model puts the 4-rank
# crossover near 8 alpha/beta ~ 300 KB.  Environment variables (read at import)
# override these defaults; keyword arguments override both.
DEFAULT_SMALL_BYTES = 256 * 1024
# Each chunk moves in segments of this many bytes, so that a segment is added into
# the buffer while the next is in flight, and is passed on at once.  256 KB and
# 64 KB segments were 2-10x slower on 16 MB (per-message overhead); 1-4 MB equal.
DEFAULT_SEGMENT_BYTES = 1024 * 1024

# A wait inside the all-reduce polls a few times, then polls with sched_yield for
# up to this long before psgd.wait's backoff sleeps.  The peer is inside the same
# call, so it is due within microseconds; MPICH's shared-memory transport moves a
# message only while both ends call into MPI, and a rank that sleeps wakes late.
# sched_yield hands the core straight to a rank that shares it (more ranks than
# cores), which made 4 ranks on 2 cores 3-4x faster below 1 MB than 100 us of
# polling and then sleeping; a peer late by a whole computation finds us asleep.
DEFAULT_SPIN_S = 5e-3

# Tags on the private duplicate of the caller's communicator (see _RingState); the ring
# uses 16 + 2s (reduce-scatter step s) and 17 + 2s (all-gather step s).
_TAG_FOLD, _TAG_DOUBLE, _TAG_UNFOLD = 3, 4, 5


class _RingState:
    """Per-communicator state: a private duplicate (its own tag space) and reusable scratch.

    Cached as an MPI attribute of the caller's communicator, so it lives exactly as
    long as that communicator (freeing that one frees the duplicate).  The duplicate gives the all-reduce a context of its
    own: no other message on the caller's communicator, not even a receive with
    ``ANY_TAG``/``ANY_SOURCE``, can match ring traffic.
    """

    __slots__ = ("comm", "rank", "size", "scratch", "plans")

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.scratch: dict[str, np.ndarray] = {}
        self.plans: OrderedDict[int, tuple] = OrderedDict()   # recursive doubling, see _plan

    def free(self) -> None:
        for plan in self.plans.values():
            _free_plan(plan)
        self.plans.clear()
        self.comm.Free()

    def scratch_for(self, dtype: np.dtype, n: int) -> np.ndarray:
        """A reusable receive buffer of ``n`` elements (grown, never shrunk, per dtype)."""
        buf = self.scratch.get(dtype.char)
        if buf is None or buf.size < n:
            buf = np.empty(max(n, 1), dtype=dtype)
            self.scratch[dtype.char] = buf
        return buf[:n]


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)   # numpy's singletons: an `is` test
_keyval: int | None = None
_by_handle: dict[int, _RingState] = {}     # fast path in front of the attribute lookup
_last_comm: MPI.Comm | None = None         # and the last caller's communicator in front of that
_last_state: _RingState | None = None


def _free_state(comm: MPI.Comm, keyval: int, state: _RingState) -> None:
    """Attribute delete callback: the caller's communicator is being freed, so free our duplicate."""
    global _last_comm, _last_state
    _by_handle.pop(comm.handle, None)
    _last_comm = _last_state = None
    if not MPI.Is_finalized():
        state.free()


def _state(comm: MPI.Comm) -> _RingState:
    global _keyval, _last_comm, _last_state
    state = _by_handle.get(comm.handle)
    if state is not None:
        _last_comm, _last_state = comm, state
        return state
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_free_state)
    state = comm.Get_attr(_keyval)
    if state is None:
        if comm.Is_inter():
            raise ValueError("ring_allreduce needs an intra-communicator, got an inter-communicator")
        state = _RingState(comm)    # collective (Dup): every rank makes its first call together
        comm.Set_attr(_keyval, state)
    _by_handle[comm.handle] = state
    _last_comm, _last_state = comm, state
    return state


_spin_s = env_float("PSGD_ALLREDUCE_SPIN_US", DEFAULT_SPIN_S * 1e6) * 1e-6
_POLLS = 4                                  # bare polls before the yield spin
_depth = env_int("PSGD_ALLREDUCE_DEPTH", 1)
_small_bytes = env_int("PSGD_ALLREDUCE_SMALL_BYTES", DEFAULT_SMALL_BYTES)
_segment_bytes = env_int("PSGD_ALLREDUCE_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES)


def _complete_all(requests: list, what) -> None:
    """Complete all requests: a few bare polls (small messages land within microseconds),
    a yield spin of up to ``_spin_s``, then psgd.wait's backoff sleeps and stall report."""
    testall = MPI.Request.Testall
    for _ in range(_POLLS):
        if testall(requests):
            return
    _wait.waitall(requests, what, spin_s=_spin_s)


def _complete(request: MPI.Request, what) -> None:
    """One request, as :func:`_complete_all`."""
    test = request.Test
    for _ in range(_POLLS):
        if test():
            return
    _wait.wait(request, what, spin_s=_spin_s)


def _check(buf, op: str, algorithm: str) -> None:
    if not isinstance(buf, np.ndarray):
        raise ValueError(f"ring_allreduce needs a numpy array, got {type(buf).__name__}")
    if buf.ndim != 1:
        raise ValueError(f"ring_allreduce needs a 1-D array, got shape {buf.shape}")
    dtype = buf.dtype
    if dtype.char not in "fd" or not dtype.isnative:
        raise ValueError(f"ring_allreduce needs native float32 or float64, got {dtype.str}")
    flags = buf.flags
    if not flags.c_contiguous:
        raise ValueError("ring_allreduce needs a contiguous array (got a strided view); "
                         "pass np.ascontiguousarray(x) and copy the result back")
    if not flags.writeable:
        raise ValueError("ring_allreduce works in place and got a read-only array")
    if op != "sum" and op != "mean":
        raise ValueError(f"unknown all-reduce op {op!r}; choose one of {', '.join(OPS)}")
    if algorithm != "auto" and algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; "
                         f"choose one of {', '.join(ALGORITHMS)}")


def ring_allreduce(comm: MPI.Comm, buf: np.ndarray, op: str = "sum", *,
                   algorithm: str = "auto", small_bytes: int | None = None,
                   segment_bytes: int | None = None, label: str = "") -> np.ndarray:
    """All-reduce ``buf`` in place across the ranks of ``comm`` (collective).

    Buffers of at least ``small_bytes`` bytes go round a bandwidth-optimal ring:
    a reduce-scatter, then an all-gather, each rank sending 2(N-1)/N of the
    buffer to its right neighbour in N-1 steps of each phase, both phases
    pipelined in segments of ``segment_bytes`` across steps.  Smaller buffers
    use recursive doubling, floor(log2 N) exchanges of the whole buffer (+2
    when N is not a power of two).  Every rank ends with bitwise identical
    values.  A wait polls with ``sched_yield`` for at most
    ``PSGD_ALLREDUCE_SPIN_US`` (default 5000) microseconds, then sleeps with
    :mod:`psgd.wait`'s backoff and stall report.

    Parameters
    ----------
    comm : MPI.Comm
        Intra-communicator; every rank calls with a buffer of the same length
        and dtype.  The first call on a communicator duplicates it (collective)
        to get a private tag space; the duplicate is cached on ``comm``.
    buf : ndarray, shape (n,), float32 or float64, C-contiguous, writeable
        This rank's contribution; overwritten with the reduction.  ``n`` may be
        anything, 0 included.
    op : {"sum", "mean"}
        Elementwise sum over ranks, or the sum divided by the number of ranks.
    algorithm : {"auto", "ring", "doubling"}
        ``auto`` picks by size; the others force one (for tests and benchmarks).
    small_bytes : int, optional
        Size threshold for ``auto``: default ``PSGD_ALLREDUCE_SMALL_BYTES``,
        else ``DEFAULT_SMALL_BYTES``.
    segment_bytes : int, optional
        Reduce-scatter segment size: default ``PSGD_ALLREDUCE_SEGMENT_BYTES``,
        else ``DEFAULT_SEGMENT_BYTES``.
    label : str
        Appended to what a stalled wait says it waits for (e.g. " of clock 12").

    Returns
    -------
    ndarray
        ``buf`` itself.

    Raises
    ------
    ValueError
        If ``buf`` is not a writeable contiguous 1-D float32/float64 array, or
        ``op``/``algorithm`` is unknown.
    """
    if not (type(buf) is np.ndarray and (buf.dtype is _F32 or buf.dtype is _F64)
            and buf.ndim == 1 and (flags := buf.flags).c_contiguous and flags.writeable
            and (op == "sum" or op == "mean") and algorithm in ALGORITHMS):
        _check(buf, op, algorithm)      # raises naming what is wrong (or passes a subclass)
    state = _last_state if comm is _last_comm else _state(comm)
    size = state.size
    n = buf.size
    if n == 0 or size == 1:
        return buf
    if algorithm == "auto":
        if small_bytes is None:
            small_bytes = _small_bytes
        algorithm = "doubling" if buf.nbytes < small_bytes or n < size else "ring"
    if algorithm == "doubling":
        _recursive_doubling(state, buf, label)
        if op == "mean":
            np.divide(buf, size, out=buf)
    else:
        if segment_bytes is None:
            segment_bytes = _segment_bytes
        _ring(state, buf, op == "mean", max(1, segment_bytes // buf.itemsize), label)
    return buf


def _ring(state: _RingState, buf: np.ndarray, mean: bool, seg: int, label: str = "") -> None:
    """Ring reduce-scatter then all-gather, pipelined in segments across steps.

    The buffer is cut into N chunks and each chunk into the same number K of
    segments.  Reduce-scatter step s sends chunk rank-s and receives chunk
    rank-s-1 from the left; as soon as segment k of step s is received and added
    in, segment k of step s+1 (that very slice) goes out to the right, so later
    steps flow while earlier ones finish.  Receives are completed in (step,
    segment) order, so sends leave in the order the right neighbour posted its
    receives (one tag per step).  At most ``depth`` reduce-scatter receives are
    posted at a time, into ``depth`` scratch slots: MPICH copies a large message
    (CMA, by the receiver) when the receive matches, so a receive posted just
    before its add is still in cache when added.  The all-gather forwards chunks
    the same way, received in place.
    """
    comm, rank, size = state.comm, state.rank, state.size
    n = buf.size
    right, left = (rank + 1) % size, (rank - 1) % size
    steps = size - 1
    bounds = [(i * n) // size for i in range(size + 1)]
    nseg = max(1, -(-(n // size) // seg))
    cap = -(-(-(-n // size)) // nseg)               # longest segment of any chunk
    what_left = f"rank {left} (ring all-reduce{label}, left neighbour)"
    what_right = f"rank {right} (ring all-reduce{label}, right neighbour)"

    def piece(chunk: int, k: int) -> tuple[int, int]:
        a, length = bounds[chunk], bounds[chunk + 1] - bounds[chunk]
        return a + (k * length) // nseg, a + ((k + 1) * length) // nseg

    order = [(s, k) for s in range(steps) for k in range(nseg)]
    depth = min(_depth, len(order))
    scratch = state.scratch_for(buf.dtype, depth * cap)

    def post_recv(i: int):
        step, k = order[i]
        lo, hi = piece((rank - step - 1) % size, k)
        slot = (i % depth) * cap
        return comm.Irecv(scratch[slot:slot + hi - lo], left, 16 + 2 * step)

    def post_send(step: int, k: int, tag_base: int, chunk: int):
        lo, hi = piece(chunk, k)
        return comm.Isend(buf[lo:hi], right, tag_base + 2 * step)

    # Reduce-scatter: afterwards this rank holds the full sum of chunk rank+1.
    recvs = deque(post_recv(i) for i in range(depth))
    sends = [post_send(0, k, 16, rank) for k in range(nseg)]
    i = 0
    for s in range(steps):
        chunk = (rank - s - 1) % size
        for k in range(nseg):
            _complete(recvs.popleft(), what_left)
            lo, hi = piece(chunk, k)
            slot = (i % depth) * cap
            np.add(buf[lo:hi], scratch[slot:slot + hi - lo], out=buf[lo:hi])
            if s + 1 < steps:
                sends.append(post_send(s + 1, k, 16, chunk))
            if i + depth < len(order):
                recvs.append(post_recv(i + depth))
            i += 1
    own = (rank + 1) % size
    if mean:
        part = buf[bounds[own]:bounds[own + 1]]
        np.divide(part, size, out=part)

    # All-gather: step s forwards chunk rank+1-s and receives chunk rank-s in place.
    # The reduce-scatter never sent chunk `own`, so it goes out at once; the chunks it
    # did send are received into, so their sends must be complete first.
    ag_sends = [post_send(0, k, 17, own) for k in range(nseg)]
    _complete_all(sends, what_right)
    sends = ag_sends
    recvs = {}
    for s in range(steps):
        for k in range(nseg):
            lo, hi = piece((rank - s) % size, k)
            recvs[(s, k)] = comm.Irecv(buf[lo:hi], left, 17 + 2 * s)
    for s in range(steps):
        for k in range(nseg):
            _complete(recvs.pop((s, k)), what_left)
            if s + 1 < steps:
                sends.append(post_send(s + 1, k, 17, (rank - s) % size))
    _complete_all(sends, what_right)


# Persistent requests of recursive doubling, cached per buffer object: a call
# then costs one Startall and one Testall per exchange instead of building two
# requests (2 of the 7 us a 4 KB all-reduce took at 2 ranks).  A plan holds its
# buffer, so the object (and its id, the key) stays alive and unique while
# cached; at most _PLANS plans, each below small_bytes, with a scratch as large.
_PLANS = 8


def _plan(state: _RingState, buf: np.ndarray) -> tuple:
    """Recursive doubling for ``buf``: (buf, scratch, stages), a stage being
    (persistent requests, whether to add scratch into buf after, peer, what)."""
    cached = state.plans.get(id(buf))
    if cached is not None:
        state.plans.move_to_end(id(buf))
        return cached
    comm, rank, size = state.comm, state.rank, state.size
    p = 1 << (size.bit_length() - 1)
    rem = size - p
    scratch = np.empty_like(buf)
    stages = []
    if rank < 2 * rem and rank % 2 == 0:
        stages.append(([comm.Send_init(buf, rank + 1, _TAG_FOLD)], False, rank + 1, "fold"))
        stages.append(([comm.Recv_init(buf, rank + 1, _TAG_UNFOLD)], False, rank + 1, "result"))
    else:
        if rank < 2 * rem:
            stages.append(([comm.Recv_init(scratch, rank - 1, _TAG_FOLD)], True, rank - 1, "fold"))
            vrank = rank // 2
        else:
            vrank = rank - rem
        mask = 1
        while mask < p:
            vpartner = vrank ^ mask
            partner = 2 * vpartner + 1 if vpartner < rem else vpartner + rem
            stages.append(([comm.Recv_init(scratch, partner, _TAG_DOUBLE),
                            comm.Send_init(buf, partner, _TAG_DOUBLE)], True, partner,
                           "recursive doubling"))
            mask <<= 1
        if rank < 2 * rem:
            stages.append(([comm.Send_init(buf, rank - 1, _TAG_UNFOLD)], False, rank - 1, "result"))
    plan = state.plans[id(buf)] = (buf, scratch, stages)
    while len(state.plans) > _PLANS:
        _free_plan(state.plans.popitem(last=False)[1])
    return plan


def _free_plan(plan: tuple) -> None:
    for requests, _, _, _ in plan[2]:
        for request in requests:
            request.Free()


def _recursive_doubling(state: _RingState, buf: np.ndarray, label: str = "") -> None:
    """Sum in place by recursive doubling; N not a power of two folds the first 2r ranks in pairs.

    With p the largest power of two <= N and r = N - p, ranks 0..2r-1 pair up:
    each even one hands its buffer to the odd one above it and sits out;
    the p remaining ranks exchange-and-add with partners at distance 1, 2, 4, ...
    (both partners compute the same a+b, so all stay bitwise identical); then
    each odd rank hands the result back to its even partner.
    """
    _, scratch, stages = _plan(state, buf)
    startall = MPI.Prequest.Startall
    for requests, add, peer, what in stages:
        startall(requests)
        _complete_all(requests, lambda: f"rank {peer} (all-reduce {what}{label})")
        if add:
            np.add(buf, scratch, out=buf)
