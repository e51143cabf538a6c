"""`psgd join` into a ring (psgd train --elastic --protocol allreduce, or adpsgd): merge into
the coordinator's communicator, take part in admitting the later joiners, then train as a
:class:`psgd.elastic.ring.Member` (adpsgd: :class:`psgd.elastic.pairs.PairsMember`) and hand
the final parameters to the coordinator."""
from __future__ import annotations

import os
import sys
import threading

from mpi4py import MPI

from psgd.elastic import leave, mapped_segments
from psgd.elastic.alive import running
from psgd.elastic.pairs import PairsMember
from psgd.elastic.ring import Member, Ring, RingBroken
from psgd.mpi import faults
from psgd.mpi.phase import phase
from psgd.nn.optim import make_optimizer

WATCH_S = 0.25   # how often a member looks at the coordinator's pid


def _watch(pid: int, slot: int) -> None:
    """End this member once the coordinator's process has (it may wait in a collective)."""
    def look():
        while running(pid):
            threading.Event().wait(WATCH_S)
        print(f"psgd: error: worker {slot}: the coordinator (pid {pid}) has ended; this worker "
              f"ends too", file=sys.stderr, flush=True)
        leave(1)
    threading.Thread(target=look, daemon=True).start()


def _merge(inter: MPI.Intercomm) -> MPI.Intracomm:
    comm = inter.Merge(high=True)
    while comm.bcast(None, root=0):   # joiners still to come: accept each with the others
        comm = comm.Accept(None, root=0).Merge(high=False)
    for c in (comm, MPI.COMM_WORLD, MPI.COMM_SELF):   # a request's error may go to either
        c.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


def member(inter: MPI.Intercomm, welcome: dict, job) -> int:
    """Train as worker ``welcome['slot']`` of the ring; the exit code."""
    slot = welcome["slot"]
    _watch(welcome["coordinator"], slot)
    with phase("merging into the ring"):
        comm = _merge(inter)
    model, reader, config = job.model, job.reader, job.config
    own = model.params.copy()
    comm.Bcast(model.params, root=0)
    comm.gather(mapped_segments(), root=0)   # the coordinator unlinks a lost member's
    pids, clocks = comm.allgather(os.getpid()), welcome["clocks"]
    optimizer = make_optimizer(config.optimizer, model.n_params, **config.opt_hparams)
    if welcome.get("windows"):
        from psgd.elastic.hogwild import member as hogwild_member
        return hogwild_member(comm, welcome, job)
    if welcome.get("pairs"):
        if welcome.get("own_start"):   # tests: each member from its own initial parameters
            model.params[:] = own
        comm.Gather(model.params, None, root=0)
        return _pairs(comm, pids, welcome, job, optimizer)

    def gradient(clock: int):
        if model.stochastic:
            model.reseed(slot, clock)
        model.loss_and_grad(*reader.batch(clock))
        return model.grad

    def step(clock: int, summed, n: int) -> None:
        optimizer.step(model.params, summed / n, config.lr_schedule(clock))

    ring = Ring(comm, pids, faults.for_rank(0))
    try:
        Member(ring, clocks, gradient, step, model.params).run()
    except RingBroken as exc:
        print(f"psgd: error: worker {slot}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"psgd: worker {slot}: the ring's {clocks} clocks are done", flush=True)
    return 0


def _pairs(comm: MPI.Intracomm, pids: list, welcome: dict, job, optimizer) -> int:
    """Train as worker ``welcome['slot']`` of an elastic adpsgd run; the exit code."""
    slot, clocks = welcome["slot"], welcome["clocks"]
    model, reader, config = job.model, job.reader, job.config

    def gradient(clock: int):
        if model.stochastic:
            model.reseed(slot, clock)
        model.loss_and_grad(*reader.batch(clock))
        return model.grad

    def step(clock: int, grad) -> None:
        optimizer.step(model.params, grad, config.lr_schedule(clock))

    name = config.topology or "ring"
    try:
        PairsMember(comm, pids, clocks, gradient, step, model.params, name, config.seed,
                    faults.for_rank(0)).run()
    except RingBroken as exc:
        print(f"psgd: error: worker {slot}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"psgd: worker {slot}: its {clocks} clocks are done", flush=True)
    return 0
