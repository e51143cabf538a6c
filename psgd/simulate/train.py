"""Training along a simulated order: the real update rule and compensation step each shard.

The servers' side is the one of :mod:`psgd.ps.server` in the order the
schedule gives (a reply copies what the rule answers, a push goes through the
rule with its staleness, the version is the fewest pushes of an unfinished
worker and advancing it calls the rule's ``advance``), so `psgd train
--replay` of the same order ends on the same parameters, bit for bit. Under a
lock-free protocol (hogwild) there is no server: a read copies the shard as
it is, and an update adds the worker's delta (its own optimizer's step from
the parameters it read), as :class:`psgd.hogwild.worker.HogwildWorker` does.
Each virtual worker's gradient is computed on its real batch at the
parameters its last reply held, and kept until its last shard has taken it;
those copies (W parameter vectors and W gradients, under hogwild the deltas
too) are the memory this takes.
"""
from __future__ import annotations

import time

import numpy as np

from psgd.errors import NonFinitePush, PsgdError, UsageError
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

    def push(self, grad: np.ndarray, w: int, clock: int, read_version: int, source: int,
             decoder=None) -> None:
        """Step with ``grad``: a float32 slice, or a coded frame that ``decoder`` decodes."""
        buf = self.rule.receive_buffer()
        if decoder is None:
            np.copyto(buf, grad)
        else:   # as psgd.ps.server decodes a coded push
            buf.fill(0.0)
            decoder.decode_add(grad, buf, f"worker {w}'s push for clock {clock}")
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


class VirtualWorkers:
    """The virtual workers: each one's parameters as last replied, and its gradient of the
    clock it last computed (kept per worker: a reply of the next clock may land on one shard
    before the push to another has been taken, and must not change that gradient)."""

    def __init__(self, job, workers: int) -> None:
        self.model, self.job = job.model, job
        self.readers = _readers(job.settings, workers)
        self.params = np.repeat(job.model.params[None, :], workers, axis=0)
        self.grads = np.zeros_like(self.params)
        self.grad_clock = np.full(workers, -1, np.int64)
        self.samples = 0

    def gradient(self, w: int, clock: int) -> np.ndarray:
        """Worker ``w``'s gradient of ``clock`` (computed once, at its parameters then)."""
        if self.grad_clock[w] != clock:
            model = self.model
            model.params[:] = self.params[w]
            if model.stochastic:
                model.reseed(w, clock)
            x, y = self.readers[w].batch(clock)
            model.loss_and_grad(x, y)
            np.copyto(self.grads[w], model.grad)
            self.grad_clock[w] = clock
            self.samples += len(y)
        return self.grads[w]

    @property
    def nbytes(self) -> int:
        """Bytes of the workers' parameters and gradients."""
        return int(self.params.nbytes + self.grads.nbytes)


class _Codec:
    """``--compress``: each virtual worker's encoder (its own rounding stream and error-feedback
    residual, as :class:`psgd.ps.worker.PSWorker` makes it) and the servers' decoder."""

    def __init__(self, config, smap, workers: int) -> None:
        from psgd.compress import make
        from psgd.compress.feedback import PushEncoder
        coding = config.compression
        self.encoders = [PushEncoder(make(coding.compress, coding.compress_bucket,
                                          seed=config.seed * 100_003 + w + 1),
                                     smap, coding.feedback) for w in range(workers)]
        self.decoder = make(coding.compress, coding.compress_bucket)
        self.frames: list = [None] * workers
        self.clock = np.full(workers, -1, np.int64)

    def frame(self, w: int, clock: int, grad: np.ndarray, s: int) -> np.ndarray:
        """Worker ``w``'s frame for shard ``s`` of clock ``clock`` (encoded once per clock)."""
        if self.clock[w] != clock:
            self.frames[w] = [f.copy() for f in self.encoders[w].encode(grad)]
            self.clock[w] = clock
        return self.frames[w][s]

    @property
    def nbytes(self) -> int:
        return sum(2 * e.residual.nbytes if e.residual is not None else 0
                   for e in self.encoders) + sum(sum(f.nbytes for f in e.frames)
                                                 for e in self.encoders)


class _Servers:
    """The parameter servers' shards, stepped by the protocol's update rule."""

    def __init__(self, job, workers: int, vw: VirtualWorkers) -> None:
        self.smap, self.vw = job.shard_map, vw
        self.shards = [_Shard(job.config, self.smap.view(job.model.params, s), workers, s)
                       for s in range(self.smap.n_shards)]
        self.read = np.zeros((workers, self.smap.n_shards), np.int64)   # version each last read
        coded = job.config.compression.compress not in (None, "none")
        self.codec = _Codec(job.config, self.smap, workers) if coded else None
        self.extra_bytes = self.codec.nbytes if coded else 0

    def reply(self, s: int, w: int, clock: int) -> None:
        shard = self.shards[s]
        self.vw.params[w, slice(*self.smap.range(s))] = shard.rule.replied(
            w, clock, shard.versions.live)
        self.read[w, s] = shard.version

    def push(self, s: int, w: int, clock: int) -> None:
        grad, codec = self.vw.gradient(w, clock), self.codec
        if codec is None:
            self.shards[s].push(grad[slice(*self.smap.range(s))], w, clock, int(self.read[w, s]),
                                self.smap.n_shards + w)
        else:
            self.shards[s].push(codec.frame(w, clock, grad, s), w, clock, int(self.read[w, s]),
                                self.smap.n_shards + w, codec.decoder)

    def finish(self, s: int, w: int) -> None:
        self.shards[s].finish(w)

    def params(self) -> np.ndarray:
        return np.concatenate([sh.versions.live for sh in self.shards])


class _LockFree:
    """Hogwild's memory: a read copies a shard as it is, an update adds the worker's delta
    (its optimizer's step from the parameters it read, taken at its first shard's update)."""

    def __init__(self, job, workers: int, vw: VirtualWorkers) -> None:
        config, n = job.config, job.model.n_params
        if config.compensation.staleness_comp != "none":
            raise UsageError(f"psgd simulate --train runs hogwild without --staleness-comp, "
                            f"not {config.compensation.staleness_comp}")
        self.smap, self.vw, self.config = job.shard_map, vw, config
        self.live = job.model.params.copy()
        self.optimizers = [make_optimizer(config.optimizer, n, **config.opt_hparams)
                           for _ in range(workers)]
        self.delta = np.zeros((workers, n), np.float32)
        self.finite = np.ones(workers, bool)
        self.delta_of = np.full(workers, -1, np.int64)
        self.skipped = 0
        self.extra_bytes = self.delta.nbytes

    def reply(self, s: int, w: int, clock: int) -> None:
        part = slice(*self.smap.range(s))
        self.vw.params[w, part] = self.live[part]

    def push(self, s: int, w: int, clock: int) -> None:
        if self.delta_of[w] != clock:
            self._step(w, clock)
        if self.finite[w]:
            part = slice(*self.smap.range(s))
            self.live[part] += self.delta[w, part]

    def _step(self, w: int, clock: int) -> None:
        read = self.vw.params[w]
        new = read.copy()
        self.optimizers[w].step(new, self.vw.gradient(w, clock), self.config.lr_schedule(clock))
        np.subtract(new, read, out=self.delta[w])
        self.delta_of[w] = clock
        self.finite[w] = bool(np.isfinite(self.delta[w]).all())
        if not self.finite[w]:
            if not self.config.skip_nonfinite:
                raise PsgdError(f"hogwild worker {w}: the update at clock {clock} holds NaN or "
                                f"Inf (use --skip-nonfinite to drop such updates)")
            self.skipped += 1

    def finish(self, s: int, w: int) -> None:
        pass

    def params(self) -> np.ndarray:
        return self.live.copy()


def train_along(job, order: np.ndarray, workers: int, on_eval=None, eval_every: int = 0) -> dict:
    """Step the job's shards along ``order`` (int32 (n, 4) shard, kind, worker, clock).

    Returns the final parameters (float32 (n,)), the samples computed, the seconds it took
    and the bytes the virtual workers' copies hold. ``on_eval(index, pushes, params,
    samples)`` is called after every ``eval_every`` pushes.
    """
    from psgd.protocols import get
    vw = VirtualWorkers(job, workers)
    lockfree = get(job.settings.protocol).staleness_unit == "updates"
    servers = (_LockFree if lockfree else _Servers)(job, workers, vw)
    t0, pushes = time.perf_counter(), 0
    for i, (s, kind, w, clock) in enumerate(order.tolist()):
        if kind == REPLIED:
            servers.reply(s, w, clock)
        elif kind == PUSHED:
            servers.push(s, w, clock)
            pushes += 1
            if on_eval is not None and eval_every and pushes % eval_every == 0:
                on_eval(i, pushes, servers.params(), vw.samples)
        elif kind == DONE:
            servers.finish(s, w)
    return {"params": servers.params(), "samples": vw.samples,
            "seconds": time.perf_counter() - t0,
            "worker_copies_bytes": vw.nbytes + servers.extra_bytes}
