"""The all-reduce with compressed messages (``--compress`` under the allreduce protocol).

fp16 goes through a ring whose every message is half precision and whose sums are
float32; qsgd, topk and sign go through an all-gather of each worker's encoded
gradient, which every worker decodes and adds in rank order (their encodings do not
add up in the coded form). Every worker ends with bitwise identical values.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.collectives.allreduce import DEFAULT_SEGMENT_BYTES
from psgd.collectives.schedules import complete, complete_all
from psgd.compress import Compressor
from psgd.compress.feedback import PushEncoder
from psgd.env import env_int
from psgd.errors import PsgdError
from psgd.kernels.compress import HALF_TO_FLOAT, fp16_decode_add, fp16_encode

_TAG_RS, _TAG_AG, _TAG_FRAME = 30, 31, 32
# the fp16 ring's pieces, in elements: the float32 ring's segments (PSGD_X_ALLREDUCE_SEGMENT_BYTES)
SEGMENT = env_int("PSGD_X_ALLREDUCE_SEGMENT_BYTES", DEFAULT_SEGMENT_BYTES) // 4


class _Whole:
    """The whole vector as one shard (what :class:`PushEncoder` asks of a shard map)."""

    n_shards = 1

    def __init__(self, n: int) -> None:
        self.n = n

    def size(self, s: int) -> int:
        return self.n

    def view(self, x: np.ndarray, s: int) -> np.ndarray:
        return x


class Fp16Ring:
    """Ring reduce-scatter then all-gather over ``comm`` with every chunk sent as fp16.

    Each chunk goes in pieces of at most ``segment`` elements, pipelined: each
    reduce-scatter hop decodes a received piece (the running float32 sum), adds its
    own float32 values and encodes and sends the piece on at once, while the next
    pieces are in flight. The owner of a finished chunk rounds it to fp16 once
    (piece by piece, as its pieces arrive), keeps that rounding, and the all-gather
    forwards its bytes unchanged. Each rank sends 2(N-1)/N of the buffer at 2
    bytes per element.
    """

    def __init__(self, comm: MPI.Comm, n: int, segment: int = SEGMENT) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        bounds = [(i * n) // self.size for i in range(self.size + 1)]
        k = max(1, -(-(n // self.size) // max(1, segment)))    # pieces per chunk
        self.pieces = [[(a + (i * (b - a)) // k, a + ((i + 1) * (b - a)) // k) for i in range(k)]
                       for a, b in zip(bounds, bounds[1:])]
        self.wire = np.zeros(2 * n, np.uint8)            # the chunks as fp16, as sent/received
        self.bytes_sent = 0

    def run(self, buf: np.ndarray, mean: bool, label: str = "") -> None:
        comm, rank, size, wire = self.comm, self.rank, self.size, self.wire
        if size == 1 or buf.size == 0:
            return
        left, right = (rank - 1) % size, (rank + 1) % size
        what = lambda: f"rank {left} or {right} (fp16 ring all-reduce{label})"   # noqa: E731
        rs_sends, ag_sends = [], []

        def send(a: int, b: int, tag: int, sends: list) -> None:
            sends.append(comm.Isend(wire[2 * a:2 * b], right, tag))
            self.bytes_sent += 2 * (b - a)

        def rounded(a: int, b: int) -> None:       # buf[a:b] = the fp16 it was sent as
            buf[a:b] = 0.0
            fp16_decode_add(wire[2 * a:2 * b], HALF_TO_FLOAT, buf[a:b])

        for a, b in self.pieces[rank]:
            fp16_encode(buf[a:b], wire[2 * a:2 * b])
            send(a, b, _TAG_RS, rs_sends)
        # reduce-scatter step s receives chunk rank-s-1 in place; the last one is the own chunk
        for s in range(size - 1):
            pieces = self.pieces[(rank - s - 1) % size]
            recvs = [comm.Irecv(wire[2 * a:2 * b], left, _TAG_RS) for a, b in pieces]
            for (a, b), recv in zip(pieces, recvs):
                complete(recv, what)
                fp16_decode_add(wire[2 * a:2 * b], HALF_TO_FLOAT, buf[a:b])
                if s < size - 2:
                    fp16_encode(buf[a:b], wire[2 * a:2 * b])
                    send(a, b, _TAG_RS, rs_sends)
                    continue
                if mean:
                    np.divide(buf[a:b], size, out=buf[a:b])
                fp16_encode(buf[a:b], wire[2 * a:2 * b])
                send(a, b, _TAG_AG, ag_sends)          # the all-gather's first step
                rounded(a, b)
        # all-gather step s receives chunk rank-s in place, where its reduce-scatter send was
        complete_all(rs_sends, what)
        for s in range(size - 1):
            pieces = self.pieces[(rank - s) % size]
            recvs = [comm.Irecv(wire[2 * a:2 * b], left, _TAG_AG) for a, b in pieces]
            for (a, b), recv in zip(pieces, recvs):
                complete(recv, what)
                if s < size - 2:
                    send(a, b, _TAG_AG, ag_sends)
                rounded(a, b)
        complete_all(ag_sends, what)


class GatherAllreduce:
    """Each worker's gradient encoded once (with its error-feedback residual), all-gathered,
    and decoded and summed in rank order by every worker.

    Each rank sends its frame to the N-1 others, so it moves (N-1)/ratio of float32's
    bytes against the ring's 2(N-1)/N: fewer whenever the compression ratio exceeds N/2.
    A codec whose frames have a fixed length (:attr:`Compressor.fixed_length`) sends them
    straight to every other rank in one round of point-to-point messages, which needs no
    rank to forward another's (MPI's all-gather runs N-1 dependent rounds, each waiting for
    a rank that may not hold a core); any other codec first all-gathers the frames'
    lengths, then the frames (MPI's all-gather-v).
    """

    def __init__(self, comm: MPI.Comm, compressor: Compressor, n: int, feedback: bool) -> None:
        self.comm, self.compressor = comm, compressor
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.encoder = PushEncoder(compressor, _Whole(n), feedback)
        self.length = compressor.max_bytes(n)
        self.frames = np.zeros(self.size * self.length, np.uint8)
        self.bytes_sent = 0

    def run(self, buf: np.ndarray, mean: bool, label: str = "") -> None:
        size = self.size
        frame = self.encoder.encode(buf)[0]
        what = lambda: f"the other workers (compressed all-gather{label})"   # noqa: E731
        if self.compressor.fixed_length:
            lengths = self._direct(frame, what)
        else:
            lengths = self._gatherv(frame, what)
        displs = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        buf[:] = 0.0
        for r in range(size):
            self.compressor.decode_add(self.frames[displs[r]:displs[r] + lengths[r]], buf,
                                       f"worker {r}'s all-gathered gradient")
        if mean:
            np.divide(buf, size, out=buf)

    def _direct(self, frame: np.ndarray, what) -> np.ndarray:
        """Every frame into :attr:`frames` at rank x length, by one message from each rank
        to each other; the lengths (all :attr:`length`)."""
        comm, rank, size, step = self.comm, self.rank, self.size, self.length
        if frame.size != step:
            raise PsgdError(f"{self.compressor.name} wrote a frame of {frame.size} bytes; its "
                            f"frames are fixed at {step} (fixed_length)")
        self.frames[rank * step:(rank + 1) * step] = frame
        others = [(rank + k) % size for k in range(1, size)]     # each rank starts at its right
        requests = [comm.Irecv(self.frames[r * step:(r + 1) * step], r, _TAG_FRAME) for r in others]
        requests += [comm.Isend(frame, r, _TAG_FRAME) for r in others]
        complete_all(requests, what)
        self.bytes_sent += (size - 1) * step
        return np.full(size, step, np.int64)

    def _gatherv(self, frame: np.ndarray, what) -> np.ndarray:
        """Every frame into :attr:`frames`, packed in rank order, by MPI's all-gathers of the
        lengths and then the frames; the lengths."""
        comm, size = self.comm, self.size
        mine = np.array([frame.size], np.int64)
        lengths = np.zeros(size, np.int64)
        complete(comm.Iallgather(mine, lengths), what)
        displs = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        gathered = self.frames[:int(lengths.sum())]
        complete(comm.Iallgatherv(frame, [gathered, lengths.tolist(), displs.tolist(), MPI.BYTE]),
                 what)
        self.bytes_sent += (size - 1) * frame.size + (size - 1) * 8
        return lengths


def make(comm: MPI.Comm, compressor: Compressor | None, n: int, feedback: bool):
    """The compressed all-reduce for ``compressor`` (None: none, use the plain all-reduce)."""
    if compressor is None:
        return None
    if compressor.summable:     # fp16; the registry refuses feedback for it
        return Fp16Ring(comm, n)
    return GatherAllreduce(comm, compressor, n, feedback)
