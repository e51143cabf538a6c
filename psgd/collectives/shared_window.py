"""The all-reduce of ranks on one node, through a shared-memory window instead of messages.

Two schedules, chosen by size: *gather* (below ``small_bytes``: every rank
copies its buffer into its row and sums all rows itself, in rank order) and
*reduce-scatter* (in pieces of ``PIECE_BYTES``: rank r sums chunk r of all
rows, then every rank copies the other chunks out). Every rank ends with the same bits.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.collectives.schedules import POLLS, SPIN_S
from psgd.env import env_int
from psgd.mpi import wait as _wait
from psgd.mpi.shared_memory import allocate_shared

# A reduce-scatter moves a buffer through the window in pieces of at most this many
# bytes, two meetings each (1 MB and 4 MB measured equal, 256 KB slower).
PIECE_BYTES = env_int("PSGD_X_ALLREDUCE_PIECE_BYTES", 1024 * 1024)
_LINE = 128                                 # bytes per counter: a cache line (pair) each


def _round_up(n: int) -> int:
    return -(-n // _LINE) * _LINE


class SharedWindow:
    """The window of one communicator whose ranks share a node (collective to make and free).

    A counter line per rank, then two halves of (N+1) ``PIECE_BYTES`` each,
    allocated by rank 0 so it is one contiguous mapping on every rank.
    """

    __slots__ = ("win", "rank", "size", "counters", "read", "halves", "seq", "half")

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.rank, self.size = rank, size = comm.Get_rank(), comm.Get_size()
        head = size * _LINE
        half = _round_up((size + 1) * PIECE_BYTES)
        nbytes = head + 2 * half
        # rank 0 allocates it all, so it is one contiguous mapping on every rank
        self.win = allocate_shared(
            comm, nbytes if rank == 0 else 0, 1,
            f"the all-reduce's {nbytes / 2**20:.1f} MB shared-memory window",
            "PSGD_X_ALLREDUCE_SHARED_BYTES=0 to all-reduce by messages only")
        mem, _ = self.win.Shared_query(0)
        raw = np.frombuffer(mem, np.uint8)
        self.counters = raw[:head].view(np.int64)[::_LINE // 8]
        self.read = self.counters.tolist     # min() of a list is 4x quicker than ndarray.min()
        self.halves = (raw[head:head + half], raw[head + half:head + 2 * half])
        self.seq = 0                        # meetings so far, the same on every rank
        self.half = 0                       # the half the next round uses
        self.win.Lock_all(MPI.MODE_NOCHECK)
        if rank == 0:
            self.counters[:] = 0
        self.win.Sync()
        _wait.barrier(comm, "the other ranks to map the all-reduce's shared-memory window")
        self.win.Sync()

    def next_half(self) -> int:
        """The half this round uses: the other one from the round before.

        A rank may start round k+1 while a slower one still reads round k's
        half; it cannot reach round k+2, and write that half again, before
        every rank has arrived in round k+1, so before every rank is done reading it.
        """
        half = self.half
        self.half = half ^ 1
        return half

    def meet(self, label: str) -> None:
        """Wait until every rank has reached this meeting; this rank's writes before it are visible.

        Each rank bumps its own counter (a cache line each) after its writes and
        waits until every counter has caught up; ``MPI_Win_sync`` on both sides
        orders the data around the counter on weakly ordered CPUs.
        """
        self.seq = seq = self.seq + 1
        read = self.read
        self.win.Sync()
        self.counters[self.rank] = seq
        for _ in range(POLLS):
            if min(read()) >= seq:
                break
        else:
            poller = _wait.Poller(lambda: self._behind(seq, label), spin_s=SPIN_S)
            while min(read()) < seq:
                poller.idle()
        self.win.Sync()

    def _behind(self, seq: int, label: str) -> str:
        late = [r for r in range(self.size) if self.counters[r] < seq]
        return f"rank {', '.join(map(str, late))} (shared-memory all-reduce{label})"

    def free(self) -> None:
        self.win.Unlock_all()
        self.win.Free()


class SharedSchedule:
    """Views of one buffer's pieces in both halves of the window, made once per buffer."""

    __slots__ = ("buf", "window", "gather", "rows", "pieces")

    def __init__(self, window: SharedWindow, buf: np.ndarray, small_bytes: int) -> None:
        self.buf, self.window = buf, window
        rank, size = window.rank, window.size
        n, dtype = buf.size, buf.dtype
        half_bytes = window.halves[0].size
        self.gather = buf.nbytes < small_bytes and size * buf.nbytes <= half_bytes
        if self.gather:
            rows = [h[:size * buf.nbytes].view(dtype).reshape(size, n) for h in window.halves]
            self.rows = [(r[rank], r[0], r[1], list(r[2:])) for r in rows]    # per half
            return
        step = max(1, PIECE_BYTES // buf.itemsize)
        # per piece, per half: (copy-in pairs, addends in rank order, own result, copy-out pairs)
        self.pieces = []
        for a in range(0, n, step):
            part = buf[a:a + min(step, n - a)]
            m = part.size
            lo, hi = (rank * m) // size, ((rank + 1) * m) // size
            per_half = []
            for h in window.halves:
                rows = h[:(size + 1) * m * buf.itemsize].view(dtype).reshape(size + 1, m)
                mine, result = rows[rank], rows[size]
                # chunk `rank` of this rank's row is read by no one else: it stays in `part`
                addends = [part[lo:hi] if j == rank else rows[j, lo:hi] for j in range(size)]
                per_half.append(([(mine[:lo], part[:lo]), (mine[hi:], part[hi:])], addends,
                                 result[lo:hi], part[lo:hi],
                                 [(part[:lo], result[:lo]), (part[hi:], result[hi:])]))
            self.pieces.append(per_half)

    def run(self, mean: bool, label: str) -> None:
        window, size = self.window, self.window.size
        if self.gather:
            buf = self.buf
            mine, first, second, rest = self.rows[window.next_half()]
            np.copyto(mine, buf)
            window.meet(label)
            np.add(first, second, out=buf)
            for row in rest:
                np.add(buf, row, out=buf)
            if mean:
                np.divide(buf, size, out=buf)
            return
        copyto, add = np.copyto, np.add
        for per_half in self.pieces:
            copy_in, addends, own, own_part, copy_out = per_half[window.next_half()]
            for dst, src in copy_in:
                copyto(dst, src)
            window.meet(label)
            add(addends[0], addends[1], out=own)
            for addend in addends[2:]:
                add(own, addend, out=own)
            if mean:
                np.divide(own, size, out=own)
            copyto(own_part, own)
            window.meet(label)
            for dst, src in copy_out:
                copyto(dst, src)

    def free(self) -> None:
        """Nothing of its own to free: the window belongs to the communicator's state."""


class SharedBroadcast:
    """Node rank 0's buffer copied to every rank through the window, a piece per meeting."""

    __slots__ = ("window", "pieces")

    def __init__(self, window: SharedWindow, buf: np.ndarray) -> None:
        self.window = window
        step = max(1, PIECE_BYTES // buf.itemsize)
        # per piece: its slice of buf and its view in each half of the window
        self.pieces = [(buf[a:a + step], [h[:buf[a:a + step].nbytes].view(buf.dtype)
                                          for h in window.halves])
                       for a in range(0, buf.size, step)]

    def run(self, mean: bool, label: str) -> None:
        """Copy rank 0's buffer to all (``mean`` is unused: the signature of a schedule's run)."""
        window, root = self.window, self.window.rank == 0
        for part, halves in self.pieces:
            slot = halves[window.next_half()]
            if root:
                np.copyto(slot, part)
            window.meet(label)
            if not root:
                np.copyto(part, slot)

    def free(self) -> None:
        """Nothing of its own to free: the window belongs to the communicator's state."""
