"""Training along a simulated order: the real update rule and compensation step each shard.

The servers' side is the one of :mod:`psgd.ps.server` in the order the
schedule gives (a reply copies what the rule answers, a push goes through the
rule with its staleness, the version is the fewest pushes of an unfinished
worker and advancing it calls the rule's ``advance``), so `psgd train
--replay` of the same order ends on the same parameters, bit for bit. Each
virtual worker's gradient is computed on its real batch at the parameters
its last reply held; those copies (W parameter vectors) are the memory this
takes.
"""
from __future__ import annotations

import time

import numpy as np

from psgd.errors import NonFinitePush
from psgd.mpi.roles import Roles
from psgd.nn.optim import make_optimizer
from psgd.ps.order import DONE, PUSHED, REPLIED
from psgd.ps.versions import ShardVersions


class _Shard:
    """One server shard: its versions, optimizer and update rule, as the real server holds them."""

    def __init__(self, config, init: np.ndarray, workers: int, shard: int) -> None:
        self.versions = ShardVersions(init.copy())
        self.optimizer = make_optimizer(config.optimizer, init.shape[0], **config.opt_hparams)
        self.rule = config.update_rule(config, self.optimizer, self.versions, n_workers=workers)
        self.pushes = np.zeros(workers, np.int64)
        self.done = np.zeros(workers, bool)
        self.version = 0
        self.shard = shard
        self.skip = config.skip_nonfinite

    def push(self, grad: np.ndarray, w: int, clock: int, read_version: int, source: int) -> None:
        buf = self.rule.receive_buffer()
        np.copyto(buf, grad)
        if not self.rule.push(buf, clock, clock - read_version, source, worker=w) and not self.skip:
            raise NonFinitePush(source, clock)
        self.pushes[w] += 1
        self.update_version()

    def finish(self, w: int) -> None:
        self.rule.worker_done(w)
        self.done[w] = True
        self.update_version()

    def update_version(self) -> None:
        active = ~self.done
        if not active.any():
            return
        new = int(self.pushes[active].min())
        if new > self.version:
            if not self.rule.advance(self.version, new) and not self.skip:
                raise ValueError(f"the sum of the pushes for clock {self.version} overflowed "
                                 f"float32 on shard {self.shard}")
            self.version = new


def build_job(settings, workers: int):
    """`psgd train`'s job for S servers and ``workers`` workers, built as a server rank builds it."""
    from psgd.run.job import build_job
    roles = Roles(comm=None, rank=0, size=settings.servers + workers,
                  n_servers=settings.servers, n_workers=workers, worker_comm=None)
    return build_job(settings, roles, False, None, "simulated")


def _readers(settings, workers: int) -> list:
    from psgd.data.reader import ShardReader
    return [ShardReader(settings.data, w, workers, settings.batch_size, seed=settings.seed,
                        augment=settings.augment) for w in range(workers)]


class _Workers:
    """The virtual workers: each one's parameters as last replied, and its gradient."""

    def __init__(self, job, workers: int) -> None:
        self.model, self.job = job.model, job
        self.readers = _readers(job.settings, workers)
        self.params = np.repeat(job.model.params[None, :], workers, axis=0)
        self.read = np.zeros((workers, job.shard_map.n_shards), np.int64)
        self.grad = np.zeros_like(job.model.params)
        self.grad_of = (-1, -1)
        self.samples = 0

    def gradient(self, w: int, clock: int) -> np.ndarray:
        """Worker ``w``'s gradient of ``clock`` (computed once, at its parameters then)."""
        if self.grad_of != (w, clock):
            model = self.model
            model.params[:] = self.params[w]
            if model.stochastic:
                model.reseed(w, clock)
            x, y = self.readers[w].batch(clock)
            model.loss_and_grad(x, y)
            np.copyto(self.grad, model.grad)
            self.grad_of = (w, clock)
            self.samples += len(y)
        return self.grad


def train_along(job, order: np.ndarray, workers: int, on_eval=None, eval_every: int = 0) -> dict:
    """Step the job's shards along ``order`` (int32 (n, 4) shard, kind, worker, clock).

    Returns the final parameters (float32 (n,)), the samples computed, the seconds it took
    and the bytes the virtual workers' parameter copies hold. ``on_eval(index, pushes, params,
    samples)`` is called after every ``eval_every`` pushes.
    """
    S, smap = job.shard_map.n_shards, job.shard_map
    shards = [_Shard(job.config, smap.view(job.model.params, s), workers, s) for s in range(S)]
    vw = _Workers(job, workers)
    t0, pushes = time.perf_counter(), 0
    for i, (s, kind, w, clock) in enumerate(order.tolist()):
        shard, part = shards[s], slice(*smap.range(s))
        if kind == REPLIED:
            vw.params[w, part] = shard.rule.replied(w, clock, shard.versions.live)
            vw.read[w, s] = shard.version
        elif kind == PUSHED:
            shard.push(vw.gradient(w, clock)[part], w, clock, int(vw.read[w, s]), S + w)
            pushes += 1
            if on_eval is not None and eval_every and pushes % eval_every == 0:
                on_eval(i, pushes, _assemble(shards), vw.samples)
        elif kind == DONE:
            shard.finish(w)
    return {"params": _assemble(shards), "samples": vw.samples,
            "seconds": time.perf_counter() - t0, "worker_copies_bytes": int(vw.params.nbytes)}


def _assemble(shards: list) -> np.ndarray:
    return np.concatenate([sh.versions.live for sh in shards])
