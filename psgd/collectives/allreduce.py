"""psgd's own all-reduce: picks the ring, recursive doubling, the shared-memory window or the
hierarchical all-reduce (window, leaders' ring, window) per call."""
from __future__ import annotations

import atexit
from collections import OrderedDict

import numpy as np
from mpi4py import MPI

from psgd.collectives.hierarchical import NodeLayout, hierarchical_allreduce
from psgd.collectives.hierarchical_pipeline import (DEFAULT_CHUNK_BYTES, PipelinedHierarchical,
                                                    chunk_count)
from psgd.collectives.schedules import DoublingSchedule, RingSchedule, Schedule
from psgd.collectives.shared_window import SharedBroadcast, SharedSchedule, SharedWindow
from psgd.env import env_int
from psgd.mpi.phase import phase

OPS = ("sum", "mean")
ALGORITHMS = ("auto", "ring", "doubling", "shared", "hierarchical")

# Defaults chosen with bench/bench_allreduce.py (figures in docs/design/architecture.md,
# "Design notes"); PSGD_X_ALLREDUCE_* variables (read at import) override them, keyword arguments both.
# Below this many bytes recursive doubling (log2 N exchanges of the whole buffer), from it
# the ring (2(N-1) exchanges of 1/N of it).
DEFAULT_SMALL_BYTES = 256 * 1024
# The ring moves each chunk in segments of this many bytes, passed on as soon as added in.
DEFAULT_SEGMENT_BYTES = 1024 * 1024
# On one node, buffers of up to this many bytes go through the shared-memory window.
DEFAULT_SHARED_BYTES = 4 * 1024 * 1024

# Cached schedules per communicator (each holds its buffer; see psgd.collectives.schedules).
_SCHEDULES = 8


class _CommState:
    """Per-communicator state: a private duplicate (its own tag space) and cached schedules.

    Cached as an MPI attribute of the caller's communicator, so it lives exactly
    as long as that communicator (freeing that one frees the duplicate and the
    schedules' requests).  The duplicate gives the all-reduce a context of its
    own: no other message on the caller's communicator, not even a receive with
    ``ANY_TAG``/``ANY_SOURCE``, can match all-reduce traffic.
    """

    __slots__ = ("comm", "rank", "size", "schedules", "layout", "one_node", "window")

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm = comm.Dup()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        # (id(buf), algorithm, segment) -> schedule, least recently used first
        self.schedules: OrderedDict[tuple, Schedule | SharedSchedule] = OrderedDict()
        self.layout = NodeLayout(self.comm)         # node and leaders' communicators
        self.one_node = self.layout.nodes == 1
        self.window: SharedWindow | None = None     # made by the first shared all-reduce

    def shared_window(self) -> SharedWindow:
        if not self.one_node:
            raise ValueError("all-reduce algorithm 'shared' needs every rank on one node; "
                             "use 'auto' or 'ring' across nodes")
        if self.window is None:
            with phase("making the all-reduce shared window"):
                self.window = SharedWindow(self.comm)   # collective, as the call itself is
        return self.window

    def schedule(self, key: tuple, build) -> Schedule:
        """The cached schedule for ``key`` (``key[0]`` is the buffer's id), else ``build()``.

        At most ``_SCHEDULES`` are kept; the least recently used is freed.  A
        schedule holds its buffer, so no other object can take that id meanwhile.
        """
        schedule = self.schedules.get(key)
        if schedule is not None:
            self.schedules.move_to_end(key)
            return schedule
        with phase("making an all-reduce schedule"):
            schedule = self.schedules[key] = build()
        while len(self.schedules) > _SCHEDULES:
            self.schedules.popitem(last=False)[1].free()
        return schedule

    def free(self) -> None:
        """Free everything (idempotent: finalising frees states before their communicators)."""
        if self.comm is None:
            return
        for schedule in self.schedules.values():
            schedule.free()
        self.schedules.clear()
        if self.window is not None:
            self.window.free()
        self.layout.free()
        self.comm.Free()
        self.comm = None


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)   # numpy's singletons: an `is` test
_keyval: int | None = None
_live: list[_CommState] = []               # in creation order, freed in reverse at MPI_Finalize
_last_comm: MPI.Comm | None = None         # fast path in front of the attribute lookup
_last_state: _CommState | None = None


def _free_state(comm: MPI.Comm, keyval: int, state: _CommState) -> None:
    """Attribute delete callback: the caller's communicator is being freed, so free our duplicate."""
    global _last_comm, _last_state
    _last_comm = _last_state = None
    if not MPI.Is_finalized():
        state.free()
    if state in _live:
        _live.remove(state)


def free_all() -> None:
    """Free every all-reduce state, newest first (collective over each state's communicator).

    Runs at exit too, before mpi4py finalises MPI (which calls no Python delete callbacks
    then): a shared window left open fails MPICH's OFI finalize.
    """
    global _last_comm, _last_state
    _last_comm = _last_state = None
    if not _live:
        return
    with phase("freeing the all-reduce state"):
        while _live:
            state = _live.pop()
            if not MPI.Is_finalized():
                state.free()


def _state(comm: MPI.Comm) -> _CommState:
    global _keyval, _last_comm, _last_state
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_free_state)
        atexit.register(free_all)          # after mpi4py's own exit hook, so it runs before
    state = comm.Get_attr(_keyval)
    if state is None:
        if comm.Is_inter():
            raise ValueError("allreduce needs an intra-communicator, got an inter-communicator")
        with phase("making the all-reduce communicators"):
            state = _CommState(comm)   # collective (Dup): every rank makes its first call together
        comm.Set_attr(_keyval, state)
        _live.append(state)
    _last_comm, _last_state = comm, state
    return state


_small_bytes = env_int("PSGD_X_ALLREDUCE_SMALL_BYTES", DEFAULT_SMALL_BYTES)
_segment_bytes = env_int("PSGD_X_ALLREDUCE_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES)
_shared_bytes = env_int("PSGD_X_ALLREDUCE_SHARED_BYTES", DEFAULT_SHARED_BYTES)


def _check(buf, op: str, algorithm: str) -> None:
    if not isinstance(buf, np.ndarray):
        raise ValueError(f"allreduce needs a numpy array, got {type(buf).__name__}")
    if buf.ndim != 1:
        raise ValueError(f"allreduce needs a 1-D array, got shape {buf.shape}")
    dtype = buf.dtype
    if dtype.char not in "fd" or not dtype.isnative:
        raise ValueError(f"allreduce needs native float32 or float64, got {dtype.str}")
    flags = buf.flags
    if not flags.c_contiguous:
        raise ValueError("allreduce needs a contiguous array (got a strided view); "
                         "pass np.ascontiguousarray(x) and copy the result back")
    if not flags.writeable:
        raise ValueError("allreduce works in place and got a read-only array")
    if op != "sum" and op != "mean":
        raise ValueError(f"unknown all-reduce op {op!r}; choose one of {', '.join(OPS)}")
    if algorithm != "auto" and algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}; "
                         f"choose one of {', '.join(ALGORITHMS)}")


def allreduce(comm: MPI.Comm, buf: np.ndarray, op: str = "sum", *,
              algorithm: str = "auto", small_bytes: int | None = None,
              segment_bytes: int | None = None, shared_bytes: int | None = None,
              chunk_bytes: int | None = None, label: str = "") -> np.ndarray:
    """All-reduce ``buf`` in place across the ranks of ``comm`` (collective).

    ``auto`` takes the shared-memory window when every rank is on one node and
    ``buf`` has at most ``shared_bytes``; the hierarchical all-reduce when the
    ranks span nodes and some node holds more than one; else recursive doubling
    below ``small_bytes`` and the ring from there (also the leaders' choice
    within the hierarchical one). Every rank ends with bitwise
    identical values. The messages are built once per buffer object and cached
    on ``comm`` (the last ``_SCHEDULES`` buffers), so reducing the same
    gradient every step costs no set-up.

    Parameters
    ----------
    comm : MPI.Comm
        Intra-communicator; every rank passes a buffer of the same length and
        dtype. The first call duplicates it (collective) for a tag space of its own.
    buf : ndarray, shape (n,), float32 or float64, C-contiguous, writeable
        This rank's contribution, overwritten with the reduction; ``n`` may be 0.
    op : {"sum", "mean"}
        Elementwise sum over ranks, or that sum divided by the number of ranks.
    algorithm : {"auto", "ring", "doubling", "shared", "hierarchical"}
        ``auto`` picks by size and placement; the others force one (``shared``
        picks its small or large schedule by ``small_bytes``; ``hierarchical``
        works on any placement).
    small_bytes, segment_bytes, shared_bytes, chunk_bytes : int, optional
        The doubling/ring threshold, the ring's segment size, the largest buffer
        ``auto`` sends through the window (0: never) and the least bytes of the
        hierarchical all-reduce's pipelined chunks (0: not pipelined); by default
        ``PSGD_X_ALLREDUCE_{SMALL,SEGMENT,SHARED,CHUNK}_BYTES``, else ``DEFAULT_*_BYTES``.
    label : str
        Appended to what a stalled wait says it waits for (e.g. " of clock 12").

    Returns
    -------
    ndarray
        ``buf`` itself.

    Raises
    ------
    ValueError
        If ``buf`` is not a writeable contiguous 1-D float32/float64 array,
        ``op``/``algorithm`` is unknown, or ``shared`` is asked for across nodes.
    """
    if not (type(buf) is np.ndarray and (buf.dtype is _F32 or buf.dtype is _F64)
            and buf.ndim == 1 and (flags := buf.flags).c_contiguous and flags.writeable
            and (op == "sum" or op == "mean") and algorithm in ALGORITHMS):
        _check(buf, op, algorithm)      # raises naming what is wrong (or passes a subclass)
    state = _last_state if comm is _last_comm else _state(comm)
    if buf.size == 0 or state.size == 1:
        return buf
    small_bytes = _small_bytes if small_bytes is None else small_bytes
    if algorithm == "auto":
        algorithm = _auto(state, buf, small_bytes, shared_bytes)
    _run(state, buf, op == "mean", algorithm, small_bytes, segment_bytes or _segment_bytes, label,
         chunk_bytes)
    return buf


def _run(state: _CommState, buf: np.ndarray, mean: bool, algorithm: str, small_bytes: int,
         segment_bytes: int, label: str, chunk_bytes: int | None = 0) -> None:
    """Run ``algorithm``'s cached schedule for ``buf`` (built on first use)."""
    comm = state.comm
    if algorithm == "shared":
        window = state.shared_window()
        state.schedule((id(buf), "shared", small_bytes),
                       lambda: SharedSchedule(window, buf, small_bytes)).run(mean, label)
    elif algorithm == "hierarchical" and (chunks := _pipelined(state, buf, chunk_bytes)) > 1:
        state.schedule((id(buf), "pipelined", chunks, small_bytes, segment_bytes),
                       lambda: _pipeline(state, buf, chunks, small_bytes, segment_bytes)).run(
            mean, label)
    elif algorithm == "hierarchical":
        layout = state.layout

        def reduce(comm, part, algorithm):
            _run(_state(comm), part, False, _auto(_state(comm), part, small_bytes, None)
                 if algorithm == "auto" else algorithm, small_bytes, segment_bytes, label)

        def broadcast(part):
            node = _state(layout.node)
            window = node.shared_window()
            node.schedule((id(part), "broadcast", 0), lambda: SharedBroadcast(window, part)).run(
                False, label)

        hierarchical_allreduce(layout, buf, state.size, mean, reduce, broadcast)
    elif algorithm == "doubling":
        state.schedule((id(buf), "doubling", 0), lambda: DoublingSchedule(comm, buf)).run(label)
        if mean:
            np.divide(buf, state.size, out=buf)
    else:
        seg = max(1, segment_bytes // buf.itemsize)
        state.schedule((id(buf), "ring", seg),
                       lambda: RingSchedule(comm, buf, seg)).run(mean, label)


def _pipelined(state: _CommState, buf: np.ndarray, chunk_bytes: int | None) -> int:
    """How many chunks the hierarchical all-reduce pipelines ``buf`` in (1: not pipelined)."""
    chunk_bytes = DEFAULT_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    if chunk_bytes <= 0 or state.layout.nodes == 1:
        return 1
    return chunk_count(buf.nbytes, buf.size, state.layout.nodes, chunk_bytes)


def _pipeline(state: _CommState, buf: np.ndarray, chunks: int, small_bytes: int,
              segment_bytes: int) -> PipelinedHierarchical:
    """The pipelined hierarchical schedule of ``buf`` (collective over the state's ranks)."""
    layout = state.layout
    node = _state(layout.node)
    window = node.shared_window() if node.size > 1 else None
    leaders = _state(layout.leaders).comm if layout.leaders is not None else None
    return PipelinedHierarchical(buf, chunks, state.size, window, node.rank == 0, leaders,
                                 small_bytes, segment_bytes)


def _auto(state: _CommState, buf: np.ndarray, small_bytes: int, shared_bytes: int | None) -> str:
    if shared_bytes is None:
        shared_bytes = _shared_bytes
    if state.one_node and buf.nbytes <= shared_bytes:
        return "shared"
    if not state.one_node and state.layout.largest > 1:
        return "hierarchical"
    return "doubling" if buf.nbytes < small_bytes or buf.size < state.size else "ring"


def auto_algorithm(comm: MPI.Comm, buf: np.ndarray, small_bytes: int | None = None,
                   shared_bytes: int | None = None) -> str:
    """The algorithm ``allreduce(comm, buf)`` takes with ``algorithm="auto"`` (collective
    the first time on ``comm``, as that call is); for benchmarks and logs."""
    if comm.Get_size() == 1 or buf.size == 0:
        return "none"
    return _auto(_state(comm), buf, _small_bytes if small_bytes is None else small_bytes,
                 shared_bytes)
