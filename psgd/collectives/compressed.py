"""The all-reduce with compressed messages (``--compress`` under the allreduce protocol).

fp16 goes through a ring whose every message is half precision and whose sums are
float32; qsgd, topk and sign go through an all-gather of each worker's encoded
gradient, which every worker decodes and adds in rank order (their encodings do not
add up in the coded form). Every worker ends with bitwise identical values.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from psgd.collectives.schedules import complete, complete_all
from psgd.compress import Compressor, PushEncoder
from psgd.kernels.compress import HALF_TO_FLOAT, fp16_decode_add, fp16_encode

_TAG_RS, _TAG_AG, _TAG_LEN, _TAG_GATHER = 30, 31, 32, 33


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

    Each reduce-scatter hop encodes the running float32 sum of a chunk, the receiver
    decodes it and adds its own float32 values; the owner of a finished chunk rounds
    it to fp16 once, keeps that rounding, and the all-gather forwards its bytes
    unchanged. Each rank sends 2(N-1)/N of the buffer at 2 bytes per element.
    """

    def __init__(self, comm: MPI.Comm, n: int) -> None:
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.bounds = [(i * n) // self.size for i in range(self.size + 1)]
        self.wire = np.zeros(2 * n, np.uint8)            # the chunks as fp16, as sent/received
        self.scratch = np.zeros(2 * (-(-n // self.size)), np.uint8)
        self.bytes_sent = 0

    def _chunk(self, buf: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
        a, b = self.bounds[c % self.size], self.bounds[c % self.size + 1]
        return buf[a:b], self.wire[2 * a:2 * b]

    def run(self, buf: np.ndarray, mean: bool, label: str = "") -> None:
        comm, rank, size = self.comm, self.rank, self.size
        if size == 1 or buf.size == 0:
            return
        left, right = (rank - 1) % size, (rank + 1) % size
        what = lambda: f"rank {left} or {right} (fp16 ring all-reduce{label})"   # noqa: E731
        for s in range(size - 1):
            out, out_wire = self._chunk(buf, rank - s)
            into, _ = self._chunk(buf, rank - s - 1)
            fp16_encode(out, out_wire)
            got = self.scratch[:2 * into.size]
            reqs = [comm.Irecv(got, left, _TAG_RS), comm.Isend(out_wire, right, _TAG_RS)]
            complete_all(reqs, what)
            self.bytes_sent += out_wire.size
            fp16_decode_add(got, HALF_TO_FLOAT, into)
        own, own_wire = self._chunk(buf, rank + 1)
        if mean:
            np.divide(own, size, out=own)
        fp16_encode(own, own_wire)
        for s in range(size - 1):
            _, out_wire = self._chunk(buf, rank + 1 - s)
            _, in_wire = self._chunk(buf, rank - s)
            reqs = [comm.Irecv(in_wire, left, _TAG_AG), comm.Isend(out_wire, right, _TAG_AG)]
            complete_all(reqs, what)
            self.bytes_sent += out_wire.size
        buf[:] = 0.0                 # every chunk, the own one too, is its fp16 rounding
        fp16_decode_add(self.wire, HALF_TO_FLOAT, buf)


class GatherAllreduce:
    """Each worker's gradient encoded once (with its error-feedback residual), all-gathered,
    and decoded and summed in rank order by every worker.

    Each rank sends its frame to the N-1 others (MPI's all-gather), so it moves
    (N-1)/ratio of float32's bytes against the ring's 2(N-1)/N: fewer whenever the
    compression ratio exceeds N/2.
    """

    def __init__(self, comm: MPI.Comm, compressor: Compressor, n: int, feedback: bool) -> None:
        self.comm, self.compressor = comm, compressor
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.encoder = PushEncoder(compressor, _Whole(n), feedback)
        self.frames = np.zeros(self.size * compressor.max_bytes(n), np.uint8)
        self.bytes_sent = 0

    def run(self, buf: np.ndarray, mean: bool, label: str = "") -> None:
        comm, size = self.comm, self.size
        frame = self.encoder.encode(buf)[0]
        what = lambda: f"the other workers (compressed all-gather{label})"   # noqa: E731
        mine = np.array([frame.size], np.int64)
        lengths = np.zeros(size, np.int64)
        complete(comm.Iallgather(mine, lengths), what)
        displs = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        gathered = self.frames[:int(lengths.sum())]
        complete(comm.Iallgatherv(frame, [gathered, lengths.tolist(), displs.tolist(), MPI.BYTE]),
                 what)
        self.bytes_sent += (size - 1) * frame.size + (size - 1) * 8
        buf[:] = 0.0
        for r in range(size):
            self.compressor.decode_add(gathered[displs[r]:displs[r] + lengths[r]], buf,
                                       f"worker {r}'s all-gathered gradient")
        if mean:
            np.divide(buf, size, out=buf)


def make(comm: MPI.Comm, compressor: Compressor | None, n: int, feedback: bool):
    """The compressed all-reduce for ``compressor`` (None: none, use the plain all-reduce)."""
    if compressor is None:
        return None
    if compressor.summable:     # fp16; the registry refuses feedback for it
        return Fp16Ring(comm, n)
    return GatherAllreduce(comm, compressor, n, feedback)
