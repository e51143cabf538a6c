"""Activations forward and their gradients backward between neighbouring stages, by persistent requests.

Stage ``s`` keeps ``slots`` receive buffers per direction, used round-robin by the run's
microbatch number ``g``; a receive is started for ``g + slots`` as soon as ``g``'s buffer
is free, which (for the schedule's bound on in-flight microbatches) is before the
neighbour sends it.  Every wait goes through :mod:`psgd.mpi.wait` and names the stage,
the microbatch and the direction.
"""
from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from psgd.env import env_float
from psgd.mpi import timeline, wait

TAG_FORWARD, TAG_BACKWARD = 4901, 4902
# A wait on a neighbour polls with sched_yield for up to this long before psgd.mpi.wait's
# backoff sleeps: the message is due within one of the neighbour's ops, and a rank that
# sleeps wakes up to a whole backoff sleep late, at every microbatch.  Only where every
# rank of the node has a core (:func:`spin_seconds`): with more ranks than cores the
# spinning ranks took time from those that compute (4 stages on 2 cores ran slower).
DEFAULT_SPIN_S = 20e-3
SPIN_S = env_float("PSGD_X_PIPELINE_SPIN_US", DEFAULT_SPIN_S * 1e6) * 1e-6


def spin_seconds(comm: MPI.Comm) -> float:
    """:data:`SPIN_S` when this node runs no more ranks of ``comm`` than the cores this
    process may use, else 0 (collective over ``comm``)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    ranks = node.Get_size()
    node.Free()
    return SPIN_S if ranks <= len(os.sched_getaffinity(0)) else 0.0


class _Channel:
    """Persistent receives from one neighbour, or persistent sends to it, round-robin over slots."""

    def __init__(self, comm, peer: int, shape: tuple, dtype, slots: int, send: bool, tag: int,
                 spin_s: float = 0.0):
        self.bufs = [np.empty(shape, dtype) for _ in range(slots)]
        self.send, self.spin_s = send, spin_s
        init = comm.Send_init if send else comm.Recv_init
        self.reqs = [init(buf, peer, tag) for buf in self.bufs]
        self.started = [False] * slots

    def slot(self, g: int) -> int:
        return g % len(self.bufs)

    def start(self, g: int) -> None:
        k = self.slot(g)
        self.reqs[k].Start()
        self.started[k] = True

    def complete(self, g: int, what) -> float:
        """Wait for slot ``g``'s request, if started; the seconds waited (a ``--timeline``
        span ``send`` or ``recv`` of microbatch ``g`` when on)."""
        k = self.slot(g)
        if not self.started[k]:
            return 0.0
        t = time.perf_counter()
        wait.wait(self.reqs[k], what, spin_s=self.spin_s)
        self.started[k] = False
        t1 = time.perf_counter()
        if timeline.current is not None:
            timeline.current.span("send" if self.send else "recv", t, t1, clock=g)
        return t1 - t

    def free(self) -> None:
        for req in self.reqs:
            req.Free()


class Links:
    """A stage's channels to its neighbours (``prev``/``next`` ranks of ``comm``, None at the ends).

    ``shape_in``/``shape_out``: one microbatch's input and output activation; ``slots``:
    this stage's receive buffers, ``next_slots``: the next stage's; ``total``: the
    microbatches of the whole run (no receive is started past it); ``spin_s``: each wait's
    yield spin before it sleeps (:func:`spin_seconds`).
    """

    def __init__(self, comm: MPI.Comm, stage: int, prev: int | None, next: int | None,
                 shape_in: tuple, shape_out: tuple, dtype, slots: int, next_slots: int,
                 prev_slots: int, total: int, spin_s: float = 0.0) -> None:
        self.stage, self.total, self.waited = stage, total, 0.0
        self.fwd_in = self.bwd_out = self.fwd_out = self.bwd_in = None
        if prev is not None:
            self.fwd_in = _Channel(comm, prev, shape_in, dtype, slots, False, TAG_FORWARD, spin_s)
            self.bwd_out = _Channel(comm, prev, shape_in, dtype, prev_slots, True, TAG_BACKWARD,
                                    spin_s)
        if next is not None:
            self.fwd_out = _Channel(comm, next, shape_out, dtype, next_slots, True, TAG_FORWARD,
                                    spin_s)
            self.bwd_in = _Channel(comm, next, shape_out, dtype, slots, False, TAG_BACKWARD, spin_s)
        for ch in (self.fwd_in, self.bwd_in):
            if ch is not None:
                for g in range(min(len(ch.bufs), total)):
                    ch.start(g)

    def _what(self, g: int, text: str):
        return lambda: f"stage {self.stage}: {text} of microbatch {g}"

    def recv_activation(self, g: int) -> np.ndarray:
        self.waited += self.fwd_in.complete(g, self._what(g, f"the activation from stage {self.stage - 1}"))
        return self.fwd_in.bufs[self.fwd_in.slot(g)]

    def recv_gradient(self, g: int) -> np.ndarray:
        self.waited += self.bwd_in.complete(g, self._what(g, f"the gradient from stage {self.stage + 1}"))
        return self.bwd_in.bufs[self.bwd_in.slot(g)]

    def release(self, g: int) -> None:
        """Microbatch ``g``'s backward is done: its receive buffers take ``g + slots``."""
        for ch in (self.fwd_in, self.bwd_in):
            if ch is not None and g + len(ch.bufs) < self.total:
                ch.start(g + len(ch.bufs))

    def send_activation(self, g: int, x: np.ndarray) -> None:
        self._send(self.fwd_out, g, x, f"stage {self.stage + 1} to take the activation")

    def send_gradient(self, g: int, dx: np.ndarray) -> None:
        self._send(self.bwd_out, g, dx, f"stage {self.stage - 1} to take the gradient")

    def _send(self, ch: _Channel, g: int, arr: np.ndarray, text: str) -> None:
        self.waited += ch.complete(g, self._what(g - len(ch.bufs), text))
        np.copyto(ch.bufs[ch.slot(g)], arr.reshape(ch.bufs[0].shape))
        ch.start(g)

    def finish(self) -> None:
        """Complete every send still in flight and free all requests (every receive was taken)."""
        for ch in (self.fwd_out, self.bwd_out):
            if ch is not None:
                for k in range(len(ch.bufs)):
                    self.waited += ch.complete(k, self._what(k, "a neighbour to take a message"))
        for ch in (self.fwd_in, self.bwd_in, self.fwd_out, self.bwd_out):
            if ch is not None:
                ch.free()
