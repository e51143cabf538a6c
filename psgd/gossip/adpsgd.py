"""Asynchronous gossip (AD-PSGD, Lian et al. 2018): a worker averages with one random neighbour when ready.

Deadlock-free by the paper's bipartite split: even workers are active, odd
ones passive, and only edges of the topology between an active and a passive
worker are used. An active worker sends its model to a neighbour it draws
(seeded) and waits for that neighbour's model; a passive one answers every
request pending at each of its steps and while it waits on anything (its
``serve``, which the run's stop checks call too), and never waits on an
active worker during training. So every wait is of an active on a
passive, which never waits back: no cycle. Both ends of a pair set their
model to the pair's mean, which the active worker never changes meanwhile.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from psgd.config import ProtocolConfig
from psgd.gossip import averaging, topology
from psgd.halves import WorkerHalf
from psgd.mpi import wait
from psgd.mpi.roles import Roles
from psgd.nn.optim import make_optimizer
from psgd.nn.vectors import check_flat

TAG_REQUEST, TAG_REPLY, TAG_DONE = 1, 2, 3


def partners(name: str, n: int) -> list[list[int]]:
    """Each worker's partners: its neighbours on ``name`` of the other parity (active: even).

    Raises
    ------
    ValueError
        An unknown or impossible topology, fewer than 2 workers, or a worker
        with no neighbour of the other parity.
    """
    near = topology.neighbours(name, n)
    if n < 2:
        raise ValueError("--protocol adpsgd needs at least 2 workers (one active, one passive)")
    out = [[j for j in near[i] if (j - i) % 2] for i in range(n)]
    lonely = [i for i in range(n) if not out[i]]
    if lonely:
        raise ValueError(f"--protocol adpsgd pairs even with odd workers, but on --topology "
                         f"{name} with W = {n} worker(s) {lonely} have no neighbour of the "
                         f"other parity; use --topology ring")
    return out


def choose(seed: int, clock: int, active: int, options: list[int]) -> int:
    """The neighbour active worker ``active`` averages with at ``clock`` (seeded, the same everywhere)."""
    return options[int(np.random.default_rng((seed, active, clock)).integers(len(options)))]


class AdpsgdWorker(WorkerHalf):
    """One worker of AD-PSGD: its own model and optimizer, averaged pairwise without global steps.

    Parameters
    ----------
    roles : Roles
        This rank's roles (a worker; no servers).
    shard_map : None
        Unused.
    config : ProtocolConfig
        ``topology``, ``seed``, ``n_params``, the optimizer and its hyper-parameters.
    ordered : bool
        A passive worker at clock c answers exactly the active neighbours that
        draw it at clock c, in worker order (waiting for them), instead of
        whatever requests are pending: the run is then a function of the seed
        alone, as a serial reference is (tests).

    Attributes
    ----------
    stats : dict
        Cumulative ``wait_s`` (an active worker waiting for its partner),
        ``serve_s``, ``optimizer_s``, ``step_s``; ``steps``, ``skipped``, ``averages``
        (pairings this worker took part in), ``bytes_sent`` and ``degree``.
    """

    def __init__(self, roles: Roles, shard_map, config: ProtocolConfig,
                 ordered: bool = False) -> None:
        comm = roles.worker_comm
        self.rank, size = comm.Get_rank(), comm.Get_size()
        self.partners = partners(config.topology or topology.DEFAULT, size)
        self.mine = self.partners[self.rank]
        self.active = self.rank % 2 == 0
        self.seed, self.ordered = int(config.seed), bool(ordered)
        self.n_params = int(config.n_params)
        self.optimizer = make_optimizer(config.optimizer, self.n_params, **config.opt_hparams)
        self.skip_nonfinite = bool(config.skip_nonfinite)
        self.buffer = np.zeros(self.n_params, np.float32)   # the partner's model
        self.reply = np.zeros(self.n_params, np.float32)    # a passive worker's answer
        self.params: np.ndarray | None = None
        self.done = 0                                        # active partners finished
        self.status = MPI.Status()
        self.stats = {"wait_s": 0.0, "serve_s": 0.0, "optimizer_s": 0.0, "step_s": 0.0,
                      "steps": 0, "skipped": 0, "averages": 0, "bytes_sent": 0, "degree": len(self.mine)}
        self.comm, request = comm.Idup()   # its own tag space
        wait.wait(request, "the other workers to set up the adpsgd communicator")

    def start(self, params: np.ndarray, clock: int = 0, same: bool = True) -> None:
        """Start every worker from worker 0's ``params`` (collective; ``same=False``: each from
        its own, for tests)."""
        check_flat(params, self.n_params, "adpsgd params")
        if same:
            wait.wait(self.comm.Ibcast(params, root=0), "worker 0 (broadcast of initial parameters)")
        self.params = params

    def step(self, params: np.ndarray, grad: np.ndarray, clock: int, lr: float) -> None:
        """Average ``params`` with a neighbour (active) or answer requests (passive), then step."""
        t0 = time.perf_counter()
        check_flat(params, self.n_params, "adpsgd params")
        check_flat(grad, self.n_params, "adpsgd grad")
        self.params = params
        if self.active:
            self._pair(params, choose(self.seed, clock, self.rank, self.mine), clock)
        elif self.ordered:
            for active in self.partners_at(clock):
                self._answer(active, clock)
        else:
            self._serve()
        t1 = time.perf_counter()
        averaging.local_step(self, params, grad, lr, clock)
        self.stats["steps"] += 1
        self.stats["optimizer_s"] += time.perf_counter() - t1
        self.stats["step_s"] += time.perf_counter() - t0

    def partners_at(self, clock: int) -> list[int]:
        """The active workers that draw this (passive) worker at ``clock``, in order."""
        return [i for i in self.mine if choose(self.seed, clock, i, self.partners[i]) == self.rank]

    def _pair(self, params: np.ndarray, partner: int, clock: int) -> None:
        t0 = time.perf_counter()
        receive = self.comm.Irecv(self.buffer, source=partner, tag=TAG_REPLY)
        send = self.comm.Isend(params, dest=partner, tag=TAG_REQUEST)
        wait.waitall([send, receive], f"worker {partner} (adpsgd average of clock {clock})")
        np.add(params, self.buffer, out=params)
        params *= np.float32(0.5)
        self.stats["bytes_sent"] += params.nbytes
        self.stats["averages"] += 1
        self.stats["wait_s"] += time.perf_counter() - t0

    def _answer(self, active: int, clock: int | None = None) -> None:
        """Take ``active``'s model, send back ours, and keep the pair's mean."""
        t0 = time.perf_counter()
        what = f"worker {active} (adpsgd average{'' if clock is None else f' of clock {clock}'})"
        wait.wait(self.comm.Irecv(self.buffer, source=active, tag=TAG_REQUEST), what)
        params = self.params
        self.reply[:] = params
        send = self.comm.Isend(self.reply, dest=active, tag=TAG_REPLY)
        np.add(params, self.buffer, out=params)
        params *= np.float32(0.5)
        wait.wait(send, what)
        self.stats["bytes_sent"] += params.nbytes
        self.stats["averages"] += 1
        self.stats["serve_s"] += time.perf_counter() - t0

    def _serve(self) -> None:
        """Answer every request pending now, and count the active partners that are done."""
        while self.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, self.status):
            source, tag = self.status.Get_source(), self.status.Get_tag()
            if tag == TAG_DONE:
                self.comm.Recv(self.buffer[:0], source=source, tag=TAG_DONE)
                self.done += 1
            else:
                self._answer(source)

    @property
    def serve(self):
        """What a passive worker runs while it waits on anything (answer pending requests)."""
        return None if self.active or self.ordered else self._serve

    def average(self, params: np.ndarray, out: np.ndarray) -> float:
        """The workers' mean model into ``out``; returns the consensus distance (collective).

        A passive worker keeps answering requests while it waits.
        """
        return averaging.average(self.comm, params, out, self.serve)

    def finish(self) -> dict:
        """End the pairings: an active worker tells its partners, a passive one answers until
        all of its active partners are done (collective with them); returns :attr:`stats`."""
        if self.ordered:
            return self.stats
        if self.active:
            empty = np.zeros(0, np.float32)
            wait.waitall([self.comm.Isend(empty, dest=j, tag=TAG_DONE) for j in self.mine],
                         "the passive partners to hear that this worker is done")
            return self.stats
        poller = wait.Poller(lambda: f"active workers {self.mine} to finish their averages "
                                     f"({self.done} of {len(self.mine)} done)")
        while self.done < len(self.mine):
            before = self.stats["averages"] + self.done
            self._serve()
            if self.stats["averages"] + self.done == before:
                poller.idle()
        return self.stats
