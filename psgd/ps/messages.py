"""Parameter-server messages: the worker and server halves of push and pull side by side.

The worker that sends them is :mod:`psgd.ps.worker`; the server loop is :mod:`psgd.ps.server`.

Layout (all buffers, no pickling; tags on ``roles.comm``, see ``TAG_*``):

* control message, ``int64[4] = [kind, clock, version, shard]`` on ``TAG_CTRL``,
  worker -> server.  ``kind`` is ``PUSH`` (a gradient payload follows),
  ``PULL`` (send me the parameters for ``clock``) or ``DONE`` (this worker has
  finished).  The server reads control messages from any source in arrival
  order; MPI's non-overtaking rule keeps each worker's messages in the order
  it sent them (push for clock c before the pull for c+1).
* push payload, ``float32[shard size]`` on ``TAG_PUSH``, sent straight from the
  worker's gradient slice right after its ``PUSH`` header.  The server probes
  it, checks its length (``Get_count``) and receives it into its own buffer.
  A server on the worker's node gets a ``PUSH_WINDOW`` header instead and no
  payload: it reads the gradient slice in place from the worker's segment of
  the push window (:mod:`psgd.ps.push_window`). A compressed push
  (``--compress``) has a ``PUSH_CODED`` header and a ``uint8`` payload: the
  shard's frame (:mod:`psgd.compress`), which the server decodes.
* pull reply, ``int64[5] = [bound, held_us, version, shard, momentum]`` on
  ``TAG_REPLY_HDR`` and ``float32[shard size]`` on ``TAG_REPLY``, received by
  the worker straight into its parameter slice.  ``bound`` is the staleness
  bound in force when the reply was sent (-1: none), which ``--staleness
  auto`` changes during the run; ``held_us`` is how long the server held the
  pull back (the protocol's wait, in microseconds); ``momentum`` holds the
  float64 bits of the momentum the worker's velocity takes under
  ``--momentum-correction`` (the staleness compensation's, :func:`reply_momentum`).
  ``shard`` = ``OVER`` (-1) ends an elastic run: the parameters that follow are the
  final ones, and the worker sends done (:mod:`psgd.elastic`); ``DROPPED`` (-2): the
  servers dropped this worker as lost, and it leaves without done.
* snapshots and the final gather (server -> rank 0): one byte buffer, a
  ``int64[4] = [clock, shard, n_arrays, 0]`` header then ``float32`` params and
  per-element optimizer state of the shard (:func:`pack_shard_state`).

Clocks and staleness.  Clocks are 0-based; a worker computes clock c on the
parameters it pulled for clock c.  A shard's *version* v is the minimum over
the (not yet finished) workers of the number of pushes it received from each,
i.e. every worker has pushed clocks 0..v-1.  A pull reply carries v; the push
for clock c carries that read version, and its staleness is ``c - v``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from mpi4py import MPI

from psgd.config import ProtocolConfig
from psgd.mpi import wait as _wait
from psgd.mpi.roles import Roles
from psgd.mpi.shardmap import ShardMap

TAG_CTRL = 7101
TAG_PUSH = 7102
TAG_REPLY_HDR = 7103
TAG_REPLY = 7104
TAG_SNAP = 7105
TAG_FINAL = 7106

PUSH, PULL, DONE, REPLY, PUSH_WINDOW, PUSH_CODED = 1, 2, 3, 4, 5, 6
KIND_NAMES = {PUSH: "push", PULL: "pull", DONE: "done", REPLY: "reply",
              PUSH_WINDOW: "push through the window", PUSH_CODED: "compressed push"}
HEADER_LEN = 4
HEADER_BYTES = 8 * HEADER_LEN
REPLY_LEN = 5   # a pull reply's header: the control header's four, then the momentum
OVER = -1       # a pull reply's shard field when an elastic run is over
DROPPED = -2    # ... when the servers dropped the (slow, not dead) worker that pulled


def check_ps_setup(roles: Roles, shard_map: ShardMap, config: ProtocolConfig) -> None:
    """Reject a config without an update rule, or a shard map that does not fit the job.

    Raises
    ------
    ValueError
        If ``config.update_rule`` is None (not a parameter-server protocol), or
        the shard map disagrees with S or ``config.n_params``.
    """
    if config.update_rule is None:
        raise ValueError(f"protocol {config.protocol!r} is not a parameter-server protocol "
                         f"(its config has no update rule)")
    if shard_map.n_shards != roles.n_servers:
        raise ValueError(f"shard map has {shard_map.n_shards} shards but the job has "
                         f"{roles.n_servers} servers")
    if shard_map.n != config.n_params:
        raise ValueError(f"shard map covers {shard_map.n} parameters but the config says "
                         f"{config.n_params}")


# ---------------------------------------------------------------- push


def worker_push(comm: MPI.Comm, shard_map: ShardMap, grad: np.ndarray, clock: int,
                read_versions: np.ndarray, headers: np.ndarray,
                in_window: Sequence[bool] | None = None,
                frames: Sequence[np.ndarray] | None = None) -> list:
    """Send the gradient for ``clock`` to every server: S headers and S payload slices.

    Parameters
    ----------
    comm : MPI.Comm
        The job communicator (server s is rank s).
    grad : ndarray, float32 (n,)
        Must not change until the returned requests complete.
    clock : int
        The 0-based clock the gradient was computed at.
    read_versions : ndarray, int64 (S,)
        Version of each shard the gradient was computed on.
    headers : ndarray, int64 (S, 4)
        Scratch for the headers; must live until the requests complete.
    in_window : sequence of bool (S,), optional
        True for the servers that read ``grad`` (the worker's segment of the
        push window, already synced) in place: they get a ``PUSH_WINDOW``
        header and no payload.
    frames : sequence of ndarray, uint8, optional
        The compressed frame of each shard, sent instead of ``grad``'s slices.

    Returns
    -------
    list of MPI.Request
        Two per server, or one per server reading the window.
    """
    reqs = []
    for s in range(shard_map.n_shards):
        window = in_window is not None and in_window[s]
        kind = PUSH_WINDOW if window else PUSH if frames is None else PUSH_CODED
        headers[s] = (kind, clock, read_versions[s], s)
        reqs.append(comm.Isend(headers[s], s, TAG_CTRL))
        if not window:
            payload = shard_map.view(grad, s) if frames is None else frames[s]
            reqs.append(comm.Isend(payload, s, TAG_PUSH))
    return reqs


def check_push_shard(comm: MPI.Comm, source: int, header: np.ndarray, shard: int) -> None:
    """Raise PsgdError when the push header ``header`` from ``source`` names another shard."""
    from psgd.errors import PsgdError
    if int(header[3]) != shard:
        raise PsgdError(f"push from rank {source} for clock {int(header[1])} names shard "
                        f"{int(header[3])}, but it reached server rank {comm.Get_rank()} which "
                        f"holds shard {shard}")


def server_push(comm: MPI.Comm, source: int, header: np.ndarray, shard: int, expected: int,
                buf: np.ndarray) -> None:
    """Receive and validate the payload of a push whose header ``header`` came from ``source``.

    Parameters
    ----------
    header : ndarray, int64 (4,)
        ``[PUSH, clock, read_version, shard]`` as received.
    shard, expected : int
        This server's shard id and its length.
    buf : ndarray, float32 (expected,)
        Receives the gradient slice.

    Raises
    ------
    PsgdError
        If the header names another shard or the payload has the wrong length.
    """
    from psgd.errors import PsgdError
    clock = int(header[1])
    check_push_shard(comm, source, header, shard)
    status = MPI.Status()
    msg = _mprobe(comm, source, TAG_PUSH, status,
                  lambda: f"the gradient payload of rank {source}'s push for clock {clock}")
    count = status.Get_count(MPI.FLOAT)
    nbytes = status.Get_count(MPI.BYTE)
    if count != expected or nbytes != 4 * expected:
        msg.Recv(np.empty(max(nbytes, 1), np.uint8))  # drain it so the abort message is the cause
        raise PsgdError(f"push from rank {source} for clock {clock} has wrong length: "
                        f"{nbytes} bytes ({nbytes / 4:g} float32), shard {shard} expects "
                        f"{expected} float32")
    _wait.wait(msg.Irecv(buf), lambda: f"the gradient payload of rank {source} (clock {clock})")


def server_push_coded(comm: MPI.Comm, source: int, header: np.ndarray, shard: int,
                      buf: np.ndarray) -> int:
    """Receive a compressed push's frame into ``buf`` (uint8, the largest frame's size).

    Returns
    -------
    int
        The frame's length in bytes, as MPI delivered it.
    """
    from psgd.errors import PsgdError
    clock = int(header[1])
    check_push_shard(comm, source, header, shard)
    status = MPI.Status()
    msg = _mprobe(comm, source, TAG_PUSH, status,
                  lambda: f"the compressed payload of rank {source}'s push for clock {clock}")
    nbytes = status.Get_count(MPI.BYTE)
    if nbytes > buf.shape[0]:
        msg.Recv(np.empty(nbytes, np.uint8))
        raise PsgdError(f"compressed push from rank {source} for clock {clock} has {nbytes} "
                        f"bytes, more than shard {shard}'s largest frame ({buf.shape[0]}): is "
                        f"--compress the same on every rank?")
    _wait.wait(msg.Irecv(buf[:nbytes]),
               lambda: f"the compressed payload of rank {source} (clock {clock})")
    return nbytes


# ---------------------------------------------------------------- pull


def worker_pull(comm: MPI.Comm, shard_map: ShardMap, params: np.ndarray, clock: int,
                requests: np.ndarray, replies: np.ndarray) -> list:
    """Ask every server for the parameters of ``clock``; replies land in ``params`` slices.

    The receives are posted before the requests are sent, so a server's reply
    never waits on this worker.

    Parameters
    ----------
    params : ndarray, float32 (n,)
        Receives the parameters (shard s into its slice).
    clock : int
        The clock the worker is about to compute.
    requests : ndarray, int64 (S, 4)
    replies : ndarray, int64 (S, 5)
        Scratch for the request headers and the reply headers
        ``[bound, held_us, version, shard, momentum]``; must live until completion.

    Returns
    -------
    list of MPI.Request
    """
    reqs = []
    for s in range(shard_map.n_shards):
        reqs.append(comm.Irecv(replies[s], s, TAG_REPLY_HDR))
        reqs.append(comm.Irecv(shard_map.view(params, s), s, TAG_REPLY))
    for s in range(shard_map.n_shards):
        requests[s] = (PULL, clock, 0, s)
        reqs.append(comm.Isend(requests[s], s, TAG_CTRL))
    return reqs


def server_pull(comm: MPI.Comm, dest: int, header: np.ndarray, params: np.ndarray) -> list:
    """Answer a pull of worker rank ``dest`` with the shard's live parameters.

    Parameters
    ----------
    header : ndarray, int64 (5,)
        ``[bound, held_us, version, shard, momentum]``; must live until completion.
    params : ndarray, float32 (shard size,)
        Must not change until the returned requests complete (the server's
        next step writes another buffer: :mod:`psgd.ps.versions`).

    Returns
    -------
    list of MPI.Request
    """
    return [comm.Isend(header, dest, TAG_REPLY_HDR), comm.Isend(params, dest, TAG_REPLY)]


def reply_momentum(replies: np.ndarray) -> np.ndarray:
    """The momentum field of reply headers ``replies`` (int64 (..., 5)) as float64, a view."""
    return replies[..., 4:].view(np.float64)[..., 0]


# ---------------------------------------------------------------- snapshots / final gather


def pack_shard_state(clock: int, shard: int, params: np.ndarray, arrays: list) -> np.ndarray:
    """One byte buffer: ``int64[4] [clock, shard, len(arrays), 0]`` then params and arrays.

    Parameters
    ----------
    params : ndarray, float32 (m,)
    arrays : list of ndarray, float32 (m,)
        Per-element optimizer state, in the optimizer's ``state_keys`` order.

    Returns
    -------
    ndarray, uint8 (32 + 4 * m * (1 + len(arrays)),)
    """
    m = params.shape[0]
    buf = np.empty(HEADER_BYTES + 4 * m * (1 + len(arrays)), np.uint8)
    buf[:HEADER_BYTES].view(np.int64)[:] = (clock, shard, len(arrays), 0)
    body = buf[HEADER_BYTES:].view(np.float32).reshape(1 + len(arrays), m)
    body[0] = params
    for i, a in enumerate(arrays):
        body[1 + i] = a
    return buf


def unpack_shard_state(buf: np.ndarray) -> tuple[int, int, np.ndarray]:
    """Inverse of :func:`pack_shard_state`: ``(clock, shard, rows)``, rows float32 (1 + k, m)."""
    clock, shard, k, _ = (int(x) for x in buf[:HEADER_BYTES].view(np.int64))
    body = buf[HEADER_BYTES:].view(np.float32)
    return clock, shard, body.reshape(1 + k, body.shape[0] // (1 + k))


def _mprobe(comm: MPI.Comm, source: int, tag: int, status: MPI.Status, what) -> MPI.Message:
    """Matched probe that sleeps between polls (psgd.mpi.wait's backoff)."""
    poller = _wait.Poller(what)
    while True:
        msg = comm.Improbe(source, tag, status)
        if msg is not None:
            return msg
        poller.idle()
