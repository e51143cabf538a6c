"""The hierarchical all-reduce pipelined in chunks: the network never waits for the node.

The buffer is cut into C chunks. Each node sums chunk c through its shared-memory
window; its leader then starts the leaders' ring on chunk c and, while that ring's
bytes cross the network, finishes the ring of chunk c-1 and hands that chunk to
its node through the window, then sums chunk c+1 (NCCL's and Horovod's
pipelining). So the window's work on one chunk overlaps the network's on the
next, and at most two rings are in flight (their tags kept apart).
"""
from __future__ import annotations

import numpy as np

from psgd.collectives.schedules import RingSchedule, complete
from psgd.collectives.shared_window import SharedBroadcast, SharedSchedule, SharedWindow
from psgd.env import env_int

# Pipelined chunks have at least this many bytes each (a buffer under two goes unpipelined);
# chosen with bench/bench_hier_chunks.py (figures in bench/results/allreduce-net.md).
DEFAULT_CHUNK_BYTES = env_int("PSGD_X_ALLREDUCE_CHUNK_BYTES", 512 * 1024)
_TAGS = 16                          # the rings' first tag (RingSchedule's default)


def chunk_count(nbytes: int, n: int, leaders: int, chunk_bytes: int) -> int:
    """How many chunks a buffer of ``n`` elements (``nbytes``) is cut into: one per
    ``chunk_bytes``, at most one per ``leaders`` elements (each ring chunk needs an element
    per leader), at least one."""
    return max(1, min(nbytes // max(1, chunk_bytes), n // max(1, leaders)))


class PipelinedHierarchical:
    """Every schedule of one buffer's pipelined hierarchical all-reduce, built once.

    ``window`` is the node's shared window (None on a node of one rank), ``leader``
    whether this rank leads its node, ``leaders`` the leaders' private communicator
    (None off leaders, or on one node).
    """

    __slots__ = ("buf", "chunks", "reduces", "broadcasts", "rings", "size", "leader")

    def __init__(self, buf: np.ndarray, chunks: int, size: int, window: SharedWindow | None,
                 leader: bool, leaders, small_bytes: int, segment_bytes: int) -> None:
        self.buf, self.size, self.leader = buf, size, leader
        n = buf.size
        self.chunks = [buf[(c * n) // chunks:((c + 1) * n) // chunks] for c in range(chunks)]
        self.reduces = self.broadcasts = [None] * chunks
        if window is not None:
            self.reduces = [SharedSchedule(window, part, small_bytes) for part in self.chunks]
            self.broadcasts = [SharedBroadcast(window, part) for part in self.chunks]
        self.rings = [None] * chunks
        if leaders is not None:
            seg = max(1, segment_bytes // buf.itemsize)
            span = 2 * leaders.Get_size()           # tags one ring uses
            self.rings = [RingSchedule(leaders, part, seg, _TAGS + (c % 2) * span)
                          for c, part in enumerate(self.chunks)]

    def run(self, mean: bool, label: str) -> None:
        """Sum (or average) the buffer over all ranks in place; collective over all of them."""
        flight = None                                # (chunk, generator, request) of the ring ahead
        for c in range(len(self.chunks)):
            if self.reduces[c] is not None:
                self.reduces[c].run(False, label)
            ring = None
            if self.rings[c] is not None:
                steps = self.rings[c].steps(False, label)
                ring = (c, steps, next(steps, None))     # its first sends are on their way
            if c > 0:
                self._finish(c - 1, flight, mean, label)
            flight = ring
        self._finish(len(self.chunks) - 1, flight, mean, label)

    def _finish(self, c: int, flight, mean: bool, label: str) -> None:
        """Complete chunk c's ring (if this rank leads), then hand the chunk to the node."""
        if flight is not None:
            _, steps, step = flight
            while step is not None:
                complete(*step)
                step = next(steps, None)
        if mean and self.leader:
            np.divide(self.chunks[c], self.size, out=self.chunks[c])
        if self.broadcasts[c] is not None:
            self.broadcasts[c].run(False, label)

    def free(self) -> None:
        for ring in self.rings:
            if ring is not None:
                ring.free()
