"""The alpha-beta cost model of one training step under each protocol, as psgd runs them.

Pure functions of a :class:`Job` (model size, compute time, W workers, S
servers as ranks 0..S-1, their placement on nodes) and a :class:`Network`
(bandwidth, latency, switched or one shared link). Each phase's time is the
busiest link's bytes over its bandwidth, plus the busiest rank's copies within
its node over the shared-memory bandwidth, plus latency per message.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from psgd.errors import UsageError

SMALL_BYTES = 256 * 1024      # psgd's all-reduce: recursive doubling below this, else the ring
STEP_PASSES = 4               # an optimizer step's passes over its vector (a sum adds one per push)
COORDINATE_BYTES = 8          # a sparse update's int32 index + float32 value per coordinate
# of a gossip exchange between nodes, the share that moves while the ranks compute (what MPI
# hands the kernel's sockets when it is posted); the rest moves once both ends poll again
# (measured on psgd net, LeNet and the CIFAR preset: docs/results/plan-net.md)
HIDDEN_EXCHANGE = 0.75


@dataclass(frozen=True)
class Network:
    """bandwidth: bytes/s of each node's link per direction (``shared``: of the one link all
    traffic between nodes shares, both directions together, as ``psgd net`` emulates);
    latency: seconds per message; shm_bandwidth: bytes/s of copies within a node."""

    bandwidth: float
    latency: float = 20e-6
    shared: bool = False
    shm_bandwidth: float = 4e9


@dataclass(frozen=True)
class Compression:
    """What ``--compress`` does to a step: pushes (and the all-reduce) carry float32's bytes
    over ``ratio``; encoding costs ``encode_s`` and decoding ``decode_s`` seconds per byte of
    float32 input (both measured); ``ring``: the all-reduce sums it in a ring (fp16), else
    every worker's encoding is all-gathered and decoded by each. Pulls stay float32."""

    ratio: float = 1.0
    encode_s: float = 0.0
    decode_s: float = 0.0
    ring: bool = True


NONE = Compression()


@dataclass(frozen=True)
class Job:
    """n_params float32 parameters; compute_s per sample on one core; W workers (ranks S..);
    placement: ``per_node`` consecutive ranks per node (a cluster), or, with ``cliques`` K,
    rank r on node r mod K (``psgd net``); ``cores``: cores all ranks share (None: one each);
    ``touched``: coordinates a worker step touches (a sparse model; None: dense);
    ``optimizer_s``: one optimizer step over the parameters on one core, as an all-reduce
    worker takes after each all-reduce (0: not priced)."""

    n_params: int
    compute_s: float
    batch: int
    workers: int
    servers: int = 0
    per_node: int = 1
    cliques: int | None = None
    cores: int | None = None
    compression: Compression = NONE
    touched: float | None = None
    optimizer_s: float = 0.0

    @property
    def ranks(self) -> int:
        return self.workers + self.servers

    @property
    def k(self) -> int:
        return self.cliques or -(-self.ranks // self.per_node)

    def node(self, rank: int) -> int:
        return rank % self.cliques if self.cliques else rank // self.per_node

    @property
    def nbytes(self) -> float:
        return 4.0 * self.n_params

    @property
    def coded_bytes(self) -> float:
        """Bytes of one worker's whole push (float32's over the compression ratio)."""
        return self.nbytes / self.compression.ratio

    @property
    def update_bytes(self) -> float:
        """Bytes of a hogwild worker's update, and of its read: float32's (dense), or index +
        value per touched coordinate (a sparse model)."""
        return self.nbytes if self.touched is None else COORDINATE_BYTES * self.touched

    @property
    def share(self) -> float:
        """A worker's slow-down when the workers outnumber the cores."""
        return max(1.0, self.workers / self.cores) if self.cores else 1.0

    @property
    def compute_step_s(self) -> float:
        """One worker's compute per step, slowed when the workers outnumber the cores."""
        return self.batch * self.compute_s * self.share

    @property
    def own_step_s(self) -> float:
        """Compute and the worker's own optimizer step, slowed as the compute."""
        return self.compute_step_s + self.optimizer_s * self.share

    def without_servers(self) -> "Job":
        """The same workers as an all-reduce job (no servers, the same placement rule)."""
        return replace(self, servers=0, cliques=self.cliques and min(self.cliques, self.workers))


def check(job: Job, net: Network) -> None:
    """Raise ValueError (one line) for inputs no job can have."""
    if job.workers < 1:
        raise UsageError(f"need at least 1 worker, got {job.workers}")
    if job.servers < 0:
        raise UsageError(f"servers must be >= 0, got {job.servers}")
    if job.n_params < 1 or job.batch < 1 or job.per_node < 1:
        raise UsageError("the model needs >= 1 parameter, the batch and ranks per node >= 1")
    if not job.compute_s > 0:
        raise UsageError(f"compute time per sample must be > 0 s, got {job.compute_s}")
    if not net.bandwidth > 0 or not net.shm_bandwidth > 0:
        raise UsageError("bandwidth must be > 0")
    if net.latency < 0:
        raise UsageError(f"latency must be >= 0 s, got {net.latency}")
    c = job.compression
    if job.optimizer_s < 0:
        raise UsageError(f"the optimizer step must take >= 0 s, got {job.optimizer_s}")
    if not c.ratio > 0 or c.encode_s < 0 or c.decode_s < 0:
        raise UsageError("the compression ratio must be > 0 and its codec times >= 0")
    if job.cliques is not None and not 1 <= job.cliques <= job.ranks:
        raise UsageError(f"nodes must be between 1 and the {job.ranks} ranks, got {job.cliques}")
    if job.touched is not None and not 0 < job.touched <= job.n_params:
        raise UsageError(f"a step must touch between 1 and the {job.n_params} parameters, got "
                         f"{job.touched}")


def expected_touched(n_features: int, n_classes: int, nnz: float, batch: int) -> float:
    """Coordinates a batch of ``linear``/``svm`` touches: K-long rows, one per distinct feature
    among ``batch x nnz`` draws (uniform features: an upper bound for skewed ones, as Zipf's
    repeat more) plus the bias row."""
    distinct = n_features * -math.expm1(batch * nnz * math.log1p(-1.0 / n_features)) \
        if n_features > 1 else 1.0
    return n_classes * (1.0 + distinct)


class Traffic:
    """Bytes of one phase: per node sent and received across nodes, per rank copied in from
    its own node."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.out, self.into = np.zeros(job.k), np.zeros(job.k)
        self.local = np.zeros(job.ranks)

    def carry(self, a: int, b: int, nbytes: float) -> None:
        na, nb = self.job.node(a), self.job.node(b)
        if na == nb:
            self.local[b] += nbytes          # one copy, by the receiver (CMA, the window)
        else:
            self.out[na] += nbytes
            self.into[nb] += nbytes

    def seconds(self, net: Network, messages: int) -> float:
        """The busiest link's time (or the shared link's), the busiest rank's copies, latency."""
        if net.shared:
            wire = float(self.out.sum()) / net.bandwidth
        else:
            wire = float(np.maximum(self.out, self.into).max(initial=0.0)) / net.bandwidth
        return wire + float(self.local.max(initial=0.0)) / net.shm_bandwidth + messages * net.latency


def _ps_counts(job: Job) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Workers and servers per node, and each worker's and server's node."""
    nodes = np.array([job.node(r) for r in range(job.ranks)])
    sn, wn = nodes[:job.servers], nodes[job.servers:]
    return np.bincount(wn, minlength=job.k), np.bincount(sn, minlength=job.k), wn, sn


def ps_push(job: Job, nbytes: float | None = None) -> Traffic:
    """One push of every worker: B/S from each worker to each server (a pull: the reverse);
    ``nbytes``: a worker's whole push (default float32's)."""
    t = Traffic(job)
    share = (job.nbytes if nbytes is None else nbytes) / job.servers
    wc, sc, wn, sn = _ps_counts(job)
    t.out = wc * (job.servers - sc) * share
    t.into = sc * (job.workers - wc) * share
    t.local = np.concatenate([wc[sn], np.zeros(job.workers)]) * share   # servers copy in
    return t


def bsp_step_s(job: Job, net: Network) -> float:
    """One clock of bsp: compute, encode, every worker's push, the servers' decode, sum and
    step, every pull (float32: the push's bytes reversed). On a switch the phases follow one
    another; on one shared link, :func:`_shared_link_bsp_s` schedules them transfer by transfer."""
    if net.shared:
        return _shared_link_bsp_s(job, net)
    c = job.compression
    push = ps_push(job, job.coded_bytes).seconds(net, 1)
    pull = ps_push(job).seconds(net, 1)
    apply_s = (job.workers + STEP_PASSES) * job.nbytes / job.servers / net.shm_bandwidth
    codec_s = (c.encode_s + job.workers * c.decode_s / job.servers) * job.nbytes
    return job.compute_step_s + push + pull + apply_s + codec_s


def _shared_link_bsp_s(job: Job, net: Network) -> float:
    """One bsp clock on one shared link, one transfer at a time.

    The servers' replies cross the link one after another, in rank order; each worker
    copies in its own node's shards, computes and encodes as soon as its reply has
    landed, and its push queues for the link behind what is on it. A server takes each
    push as it lands (a copy from its own node, the decode, one pass to add it) and
    steps after the last.
    """
    c = job.compression
    _, sc, wn, _ = _ps_counts(job)
    share, shm = job.nbytes / job.servers, net.shm_bandwidth
    remote = (job.servers - sc[wn]).astype(float)          # servers across the link
    pull_s = remote * share / net.bandwidth
    link = float(pull_s.sum())
    pulled = np.where(remote > 0, np.cumsum(pull_s), 0.0) + sc[wn] * share / shm
    ready = pulled + net.latency + job.compute_step_s + c.encode_s * job.nbytes
    landed = []
    for w in np.argsort(ready, kind="stable"):
        at = ready[w]
        if remote[w]:
            link = max(link, at) + remote[w] * job.coded_bytes / job.servers / net.bandwidth
            at = link
        landed.append((at + net.latency, share / shm if sc[wn[w]] else 0.0))
    done = 0.0
    for at, copy_s in sorted(landed):
        done = max(done, at) + copy_s + c.decode_s * share + share / shm
    return done + STEP_PASSES * share / shm


def closed_loop_rate(clients: int, think_s: float, service_s: float | list[float]) -> float:
    """Cycles per second of ``clients`` that each spend ``think_s`` on their own, then visit
    each station of ``service_s`` (one, or a list) in turn, queueing for it as it serves one
    at a time for its seconds (exact mean value analysis of the closed network, Reiser and
    Lavenberg 1980)."""
    demand = np.atleast_1d(np.asarray(service_s, dtype=float))
    queue, rate = np.zeros_like(demand), 0.0
    for n in range(1, clients + 1):
        response = demand * (1.0 + queue)
        rate = n / (think_s + float(response.sum()))
        queue = rate * response
    return rate


def async_rate(job: Job, net: Network, push_bytes: float | None = None,
               pull_bytes: float | None = None, step_bytes: float | None = None) -> float:
    """Worker steps per second under asp (and ssp, hogwild: no barrier).

    Each worker cycles compute, push, the optimizer step, pull on its own, its push
    and pull alone on its link. A push carries ``push_bytes`` (default: the coded
    bytes), a pull ``pull_bytes`` (default: float32's). The step is each server's, on
    its B/S (it decodes and reads the push, then steps), one push at a time, so
    pushes queue for it; the transfers of a round queue for the busiest link (or the
    shared one), each worker step holding it for its share of the round's bytes. The
    workers are the clients of :func:`closed_loop_rate`, thinking for their own cycle
    (their harmonic mean) less that share, served by the step and the link. With
    ``step_bytes`` the step is the worker's own, on that many bytes, and only the
    link queues (hogwild).
    """
    c = job.compression
    push_bytes = job.coded_bytes if push_bytes is None else push_bytes
    pull_bytes = job.nbytes if pull_bytes is None else pull_bytes
    wc, sc, wn, sn = _ps_counts(job)
    if step_bytes is None:     # each server decodes the push, reads it and steps its B/S
        own_s = 0.0
        server_s = ((1 + STEP_PASSES) / net.shm_bandwidth + c.decode_s) * job.nbytes / job.servers
    else:
        own_s, server_s = STEP_PASSES * step_bytes / net.shm_bandwidth, 0.0
    alone = 2 * net.latency + c.encode_s * job.nbytes + own_s
    for nbytes in (push_bytes, pull_bytes):
        share = nbytes / job.servers
        alone = alone + ((job.servers - sc[wn]) * share / net.bandwidth
                         + sc[wn] * share / net.shm_bandwidth)
    rate = float(np.sum(1.0 / (job.compute_step_s + alone)))
    push, pull = ps_push(job, push_bytes), ps_push(job, pull_bytes)
    # a round (a step of every worker) pushes and pulls: on one shared link all of both;
    # on a switch the busiest link carries the pushes one way and the pulls the other
    if net.shared:
        busiest = push.out.sum() + pull.out.sum()
    else:
        busiest = np.maximum(push.out + pull.into, push.into + pull.out).max()
    link_s = float(busiest) / job.workers / net.bandwidth   # a worker step's share of it
    # the workers' transfers queue for that link as their pushes do for the server's step
    think = max(0.0, job.workers / rate - link_s)
    return closed_loop_rate(job.workers, think, [server_s, link_s])


def flat_allreduce_s(job: Job, ranks: list[int], net: Network) -> float:
    """psgd's all-reduce by messages over ``ranks``: doubling below SMALL_BYTES, else the ring."""
    return groups_allreduce_s(job, [ranks], net)


def groups_allreduce_s(job: Job, groups: list[list[int]], net: Network) -> float:
    """:func:`flat_allreduce_s` run by every group of ``groups`` (of one size) at once, as the
    replicas of a split each run their own group's: their bytes share the links; the
    messages are one group's. Below SMALL_BYTES recursive doubling (pairs folded first when
    the size is no power of two), each message the whole buffer; else the ring, each rank
    sending 2(N-1)/N of it to its right neighbour."""
    n = len(groups[0])
    if n == 1:
        return 0.0
    if job.nbytes < SMALL_BYTES:
        pairs, messages = _doubling(n)
        each = job.nbytes
    else:
        pairs, messages = [(i, (i + 1) % n) for i in range(n)], 2 * (n - 1)
        each = 2 * (n - 1) / n * job.nbytes
    ranks, cols = np.asarray(groups), np.array(pairs)
    src, dst = ranks[:, cols[:, 0]].ravel(), ranks[:, cols[:, 1]].ravel()
    ns, nd = (src % job.cliques, dst % job.cliques) if job.cliques else \
        (src // job.per_node, dst // job.per_node)
    same, total = ns == nd, Traffic(job)
    total.local = np.bincount(dst[same], minlength=job.ranks)[:job.ranks] * each  # copied in by the receiver
    total.out = np.bincount(ns[~same], minlength=job.k)[:job.k] * each
    total.into = np.bincount(nd[~same], minlength=job.k)[:job.k] * each
    return total.seconds(net, messages)


def _doubling(n: int) -> tuple[list[tuple[int, int]], int]:
    """Recursive doubling in a group of ``n``: (sender, receiver) positions of its messages
    (position 2i hands to 2i+1 and back when folding), and its rounds."""
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    pairs = [x for i in range(rem) for x in ((2 * i, 2 * i + 1), (2 * i + 1, 2 * i))]
    survivors = [2 * i + 1 for i in range(rem)] + list(range(2 * rem, n))
    mask, rounds = 1, 0
    while mask < p:
        pairs += [(r, survivors[v ^ mask]) for v, r in enumerate(survivors)]
        mask <<= 1
        rounds += 1
    return pairs, rounds + (2 if rem else 0)


def compressed_allreduce_s(job: Job, ranks: list[int], net: Network) -> float:
    """The compressed all-reduce (psgd.collectives.compressed): the fp16 ring, or the
    all-gather of each rank's encoding (N-1 frames to the right neighbour, MPI's ring); the
    codec's work slowed as the compute when the workers outnumber the cores."""
    n, c = len(ranks), job.compression
    if n == 1:
        return 0.0
    t = Traffic(job)
    if c.ring:      # N-1 chunks encoded and decoded, then the own chunk encoded and all decoded
        for i, r in enumerate(ranks):
            t.carry(r, ranks[(i + 1) % n], 2 * (n - 1) / n * job.coded_bytes)
        codec_s = (c.encode_s + c.decode_s * (2 * n - 1) / n) * job.nbytes
    else:           # one encoding, every rank's decoded
        for i, r in enumerate(ranks):
            t.carry(r, ranks[(i + 1) % n], (n - 1) * job.coded_bytes)
        codec_s = (c.encode_s + n * c.decode_s) * job.nbytes
    return t.seconds(net, 2 * (n - 1) if c.ring else n) + codec_s * job.share


def ring_step_s(job: Job, net: Network) -> float:
    """One step of the allreduce protocol: compute, the all-reduce by messages (psgd's
    ring/doubling, flat; the compressed all-reduce under compression), the optimizer step."""
    ranks = list(range(job.servers, job.ranks))
    if job.compression != NONE:
        return job.own_step_s + compressed_allreduce_s(job, ranks, net)
    return job.own_step_s + flat_allreduce_s(job, ranks, net)


def hierarchical_step_s(job: Job, net: Network) -> float:
    """One step with the hierarchical all-reduce: the window, the leaders' ring, the window.

    Within a node each rank copies B into the window and B out, twice (the sum,
    then the broadcast); across, the lowest rank of each node runs the flat all-reduce.
    """
    ranks = range(job.servers, job.ranks)
    leaders = sorted({job.node(r): r for r in reversed(ranks)}.values())
    largest = max(np.bincount([job.node(r) for r in ranks]))
    window = 4 * job.nbytes / net.shm_bandwidth + 2 * net.latency if largest > 1 else 0.0
    return job.own_step_s + window + flat_allreduce_s(job, leaders, net)


def balanced_servers(workers: int, worker_bw: float, server_bw: float) -> int:
    """The fewest servers whose links together carry what the workers' do (BytePS's rule:
    total server bandwidth >= total worker bandwidth): W on equal links."""
    return max(1, math.ceil(workers * worker_bw / server_bw - 1e-9))


def predict(job: Job, net: Network) -> dict[str, dict]:
    """Predicted step time, throughput and scaling efficiency of each protocol.

    Each registry entry's ``cost`` (:class:`psgd.protocols.Protocol`) gives its rows.

    Returns
    -------
    dict
        name -> {"step_s": seconds per worker step, "samples_per_s", "efficiency"
        (throughput over W workers computing alone, without communication),
        "sync": bool}. PS protocols need ``job.servers`` >= 1, the others run on
        ``job.workers`` ranks without servers.
    """
    from psgd.protocols import PROTOCOLS
    check(job, net)
    ideal = job.workers * job.batch / (job.batch * job.compute_s)
    out: dict[str, dict] = {}
    for entry in PROTOCOLS.values():
        if entry.cost is None or (entry.servers and not job.servers):
            continue
        rows = entry.cost_model()(job if entry.servers else job.without_servers(), net, entry.name)
        for name, (step_s, sync) in rows.items():
            rate = job.workers / step_s                  # worker steps per second
            out[name] = {"step_s": step_s, "samples_per_s": rate * job.batch,
                         "efficiency": rate * job.batch / ideal, "sync": sync}
    return out


def recommend(predicted: dict[str, dict], async_gain: float = 1.2) -> str:
    """The fastest synchronous protocol, unless an asynchronous one is ``async_gain`` times faster
    (staleness costs accuracy per sample; see docs/results/staleness.md)."""
    best = max(predicted, key=lambda n: predicted[n]["samples_per_s"])
    sync = max((n for n in predicted if predicted[n]["sync"]),
               key=lambda n: predicted[n]["samples_per_s"])
    gain = predicted[best]["samples_per_s"] / predicted[sync]["samples_per_s"]
    return best if gain >= async_gain else sync
