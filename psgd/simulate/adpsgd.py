"""Asynchronous gossip (AD-PSGD) simulated: pair events on a heap, and training along their order.

An active (even) worker ends its compute, sends its model to the neighbour it
draws (:func:`psgd.gossip.adpsgd.choose`, the real seeded draw) and waits for
the reply; a passive (odd) one answers the requests that have landed when its
compute ends, and those that land while it answers, then steps; while it
waits on the others (the model averages the run logs, its end) it answers
each request as it lands, as :class:`psgd.gossip.adpsgd.AdpsgdWorker` does.
The order is a list of GRAD (a worker's gradient at its model then), PAIR
(both ends take the pair's mean) and STEP (a worker's optimizer step with that
gradient) rows, which training follows with the real worker's arithmetic.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

import numpy as np

from psgd.plan.cost import STEP_PASSES

GRAD, PAIR, STEP = range(3)           # the order's kinds
_COMPUTED, _LANDED, _CHECK, _REPLY, _LEAVE = range(5)   # the loop's events
_COMPUTING, _SERVING, _WAITING = range(3)      # a worker's state


@dataclass(frozen=True)
class Costs:
    """Bytes of a model, seconds a pair's mean (2 passes) and an optimizer step take, and
    seconds the workers' model average takes once all are in."""

    nbytes: float
    average_s: float
    step_s: float
    meet_s: float


def costs(job, net) -> Costs:
    """The costs on `psgd plan`'s model: passes at the shared-memory bandwidth, and the
    logged model average as a ring all-reduce's 2 (W - 1) / W models over one link."""
    from psgd.simulate.links import transfer_s
    W, nbytes = job.workers, job.nbytes
    ring = 2 * (W - 1) / W * nbytes
    meet = transfer_s(job, net, job.servers, job.servers + W - 1, ring) if W > 1 else 0.0
    return Costs(nbytes, 2 * nbytes / net.shm_bandwidth, STEP_PASSES * nbytes / net.shm_bandwidth,
                 meet)


@dataclass
class PairSchedule:
    """What a simulation found. ``order``: int32 (n, 4) kind, worker, partner (-1), clock of
    every GRAD, PAIR (worker the active one, at its clock) and STEP in time order, ``times``
    float64 (n,) when; ``ends`` float64 (W, T) when each step ended; ``waits`` float64 (W,)
    seconds each active worker waited for its partners."""

    order: np.ndarray
    times: np.ndarray
    ends: np.ndarray
    waits: np.ndarray
    seconds: float


class _Loop:
    def __init__(self, times, partners, seed: int, links, costs: Costs, meets) -> None:
        self.times, self.partners, self.seed = times, partners, int(seed)
        self.links, self.costs, self.meets = links, costs, set(meets)
        self.W, self.T = times.shape
        self.heap: list = []
        self.seq = 0
        self.rows: list[tuple] = []
        self.state = [_COMPUTING] * self.W
        self.clock = [0] * self.W
        self.free = [0.0] * self.W             # a passive worker answers until then
        self.pending: list[list[int]] = [[] for _ in range(self.W)]   # landed requests
        self.asked = [0.0] * self.W            # when an active worker's request left
        self.ends = np.zeros((self.W, self.T))
        self.waits = np.zeros(self.W)
        self.arrived: dict[int, list] = {}     # a model average's step: [workers in, latest]

    def at(self, t: float, kind: int, a: int, b: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))

    def row(self, t: float, kind: int, i: int, j: int, k: int) -> None:
        self.rows.append((t, len(self.rows), kind, i, j, k))

    def run(self) -> float:
        for i in range(self.W):
            self._compute(i, 0.0)
        handlers = (self._computed, self._landed, self._check, self._reply, self._leave)
        t = 0.0
        while self.heap:
            t, _, kind, a, b = heapq.heappop(self.heap)
            handlers[kind](t, a, b)
        return max(t, max(self.free))

    def _compute(self, i: int, t: float) -> None:
        k = self.clock[i]
        self.state[i] = _COMPUTING
        self.row(t, GRAD, i, -1, k)
        self.at(t + self.times[i, k], _COMPUTED, i)

    def _computed(self, t: float, i: int, _b: int) -> None:
        if i % 2 == 0:   # active: its model to the partner it draws
            from psgd.gossip.adpsgd import choose
            p = choose(self.seed, self.clock[i], i, self.partners[i])
            self.asked[i] = t
            self.at(self.links.send(i, p, self.costs.nbytes, t), _LANDED, p, i)
        else:
            self.state[i] = _SERVING
            self._serve(i, t)

    def _landed(self, t: float, p: int, a: int) -> None:
        self.pending[p].append(a)
        if self.state[p] == _WAITING:   # waiting on the others: answers as requests land
            self._serve(p, t)

    def _serve(self, p: int, t: float) -> None:
        """Answer every landed request in arrival order: the pair's mean at both ends."""
        t0 = max(t, self.free[p])
        for a in self.pending[p]:
            self.row(t0, PAIR, a, p, self.clock[a])
            landed = self.links.send(p, a, self.costs.nbytes, t0)
            self.at(landed, _REPLY, a)
            t0 = max(landed, t0 + self.costs.average_s)
        self.pending[p] = []
        self.free[p] = t0
        if self.state[p] == _SERVING:   # then look again for requests that landed meanwhile
            self.at(t0, _CHECK, p)

    def _check(self, t: float, p: int, _b: int) -> None:
        if self.pending[p]:
            self._serve(p, t)
        else:
            self._stepped(p, t + self.costs.step_s)

    def _reply(self, t: float, a: int, _b: int) -> None:
        self.waits[a] += t - self.asked[a]
        self._stepped(a, t + self.costs.average_s + self.costs.step_s)

    def _stepped(self, i: int, t: float) -> None:
        k = self.clock[i]
        self.row(t, STEP, i, -1, k)
        self.ends[i, k] = t
        self.clock[i] = k + 1
        self.free[i] = max(self.free[i], t)
        if k + 1 in self.meets:   # the model average: every worker in, answering meanwhile
            self.state[i] = _WAITING
            self._meet(k + 1, i, t)
        elif k + 1 < self.T:
            self._compute(i, t)
        else:
            self.state[i] = _WAITING

    def _meet(self, step: int, i: int, t: float) -> None:
        come = self.arrived.setdefault(step, [0, 0.0])
        come[0] += 1
        come[1] = max(come[1], t)
        if come[0] < self.W:
            return
        if step < self.T:
            for j in range(self.W):
                self.at(come[1] + self.costs.meet_s, _LEAVE, j)

    def _leave(self, t: float, i: int, _b: int) -> None:
        self._compute(i, max(t, self.free[i]))


def simulate_pairs(times: np.ndarray, partners: list, seed: int, links, costs: Costs,
                   meets=()) -> PairSchedule:
    """Run AD-PSGD to its end: every worker computes ``times.shape[1]`` steps.

    Parameters
    ----------
    times : float64 (W, T)
        Seconds of each worker's compute at each clock.
    partners : list of lists
        Each worker's partners (:func:`psgd.gossip.adpsgd.partners`); even workers are active.
    seed : int
        The run's seed (the partner each active worker draws at each clock).
    links : Links
        The network, ranks 0..W-1 the workers.
    costs : Costs
    meets : iterable of int
        Steps after which every worker averages the models (the run's log records), waiting
        for all (a passive one answering meanwhile).
    """
    loop = _Loop(np.asarray(times, np.float64), partners, seed, links, costs, meets)
    seconds = loop.run()
    rows = sorted(loop.rows)
    return PairSchedule(order=np.array([r[2:] for r in rows], np.int32).reshape(-1, 4),
                        times=np.array([r[0] for r in rows], np.float64), ends=loop.ends,
                        waits=loop.waits, seconds=seconds)


def summary(schedule: PairSchedule, times: np.ndarray) -> dict:
    """The JSON-ready summary in the parameter servers' keys (staleness 0: a pair averages
    the two models as they are), with the pairs and the active workers' mean wait."""
    W, T = schedule.ends.shape
    sec, ends = schedule.seconds, schedule.ends
    first = ends[:, 0].min()   # as a real run's timeline is read (bench_simulate.real_rate)
    steady = W * (T - 1) / (ends.max() - first) if T > 1 and ends.max() > first else float("inf")
    busy = times.sum(axis=1) / sec
    pairs = int((schedule.order[:, 0] == PAIR).sum())
    zero = {"mean": 0.0, "p50": 0, "p99": 0, "max": 0, "histogram": [W * T]}
    return {"simulated_s": sec, "updates": W * T, "updates_per_s": W * T / sec,
            "steady_updates_per_s": steady, "staleness": zero, "delay": dict(zero),
            "pairs": pairs, "active_wait_s": float(schedule.waits[::2].mean()),
            "worker_utilisation": {"mean": float(busy.mean()), "min": float(busy.min()),
                                   "max": float(busy.max())},
            "server_utilisation": [], "link_utilisation": 0.0}


class _Local:
    """What :func:`psgd.gossip.averaging.local_step` reads of a worker."""

    def __init__(self, config, n: int, rank: int) -> None:
        from psgd.nn.optim import make_optimizer
        self.optimizer = make_optimizer(config.optimizer, n, **config.opt_hparams)
        self.skip_nonfinite = bool(config.skip_nonfinite)
        self.rank = rank
        self.stats = {"skipped": 0}


def train_pairs(job, order: np.ndarray, workers: int, on_eval=None, eval_every: int = 0) -> dict:
    """Train W models along ``order``: a GRAD row takes the worker's gradient at its model, a
    PAIR row sets both models to their float32 mean (as both real ends compute it), a STEP
    row steps the worker's own optimizer with its gradient (the real ``local_step``).

    Returns the mean model (float32 (n,)) as ``params``, the samples, the seconds and the
    bytes of the W models and gradients; ``on_eval(index, steps, mean model, samples)``
    after every ``eval_every`` steps.
    """
    from psgd.gossip.averaging import local_step
    from psgd.simulate.train import VirtualWorkers
    vw = VirtualWorkers(job, workers)
    x, n = vw.params, job.model.n_params
    local = [_Local(job.config, n, w) for w in range(workers)]
    t0, steps = time.perf_counter(), 0
    for index, (kind, i, j, k) in enumerate(order.tolist()):
        if kind == GRAD:
            vw.gradient(i, k)
        elif kind == PAIR:
            np.add(x[i], x[j], out=x[i])
            x[i] *= np.float32(0.5)
            x[j] = x[i]
        else:
            local_step(local[i], x[i], vw.gradient(i, k), job.config.lr_schedule(k), k)
            steps += 1
            if on_eval is not None and eval_every and steps % eval_every == 0:
                on_eval(index, steps, x.mean(axis=0, dtype=np.float32), vw.samples)
    return {"params": x.mean(axis=0, dtype=np.float32), "samples": vw.samples,
            "seconds": time.perf_counter() - t0, "worker_copies_bytes": vw.nbytes}
