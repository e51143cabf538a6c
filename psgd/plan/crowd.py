"""A step's slow-down when the ranks outnumber the cores, measured: copies of the step run at
once, two per core and free to move as mpiexec starts ranks, against twice the step alone
(sharing a core costs its caches and the switches between the copies besides the halved time)."""
from __future__ import annotations

import multiprocessing
import os
import time

import numpy as np

PER_CORE = 2          # the copies per core the slow-down is measured at
CROWD_SECONDS = 0.25  # of steps, alone and crowded: many scheduler slices (PSGD_X_CROWD_SECONDS)
CROWD_REPEATS = 3     # rounds (alone, then crowded) whose median ratio is kept (PSGD_X_CROWD_REPEATS)


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def _seconds_per_step(step, seconds: float) -> float:
    """Mean seconds of ``step()`` over about ``seconds`` of them (at least two)."""
    done, start = 0, time.perf_counter()
    while done < 2 or time.perf_counter() - start < seconds:
        step()
        done += 1
    return (time.perf_counter() - start) / done


def _copy(step, seconds: float, out, start) -> None:
    step()                                 # its buffers, before the copies start together
    start.wait()
    out.put(_seconds_per_step(step, seconds))


def _one_ratio(step, seconds: float, n_cores: int) -> float:
    """One round: ``step()``'s mean alone, then ``PER_CORE x n_cores`` forked copies' mean
    at once; their ratio over ``PER_CORE``."""
    alone = _seconds_per_step(step, seconds)
    ctx = multiprocessing.get_context("fork")
    out, start = ctx.Queue(), ctx.Barrier(PER_CORE * n_cores)
    procs = [ctx.Process(target=_copy, args=(step, seconds, out, start))
             for _ in range(PER_CORE * n_cores)]
    for p in procs:
        p.start()
    crowded = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return float(np.mean(crowded)) / (PER_CORE * alone)


def crowd_ratio(step, seconds: float | None = None, n_cores: int | None = None,
                repeats: int | None = None) -> float:
    """The median over ``repeats`` rounds of ``PER_CORE x n_cores`` concurrent copies'
    (forked processes) mean ``step()`` over ``PER_CORE`` times its mean alone, each over
    about ``seconds`` of steps (many scheduler slices); at least 1 (the cores' share is the
    least slow-down). ``step``: a callable with no arguments; ``seconds`` None:
    ``PSGD_X_CROWD_SECONDS``, else :data:`CROWD_SECONDS`; ``repeats`` None:
    ``PSGD_X_CROWD_REPEATS``, else :data:`CROWD_REPEATS` (the median keeps one round that
    other processes slowed, alone or crowded, from moving the ratio)."""
    from psgd.env import env_float, env_int
    from psgd.errors import UsageError
    seconds = seconds or env_float("PSGD_X_CROWD_SECONDS", CROWD_SECONDS)
    repeats = repeats or env_int("PSGD_X_CROWD_REPEATS", CROWD_REPEATS)
    if repeats < 1:
        raise UsageError(f"PSGD_X_CROWD_REPEATS must be >= 1, got {repeats}")
    n_cores = n_cores or cores()
    step()
    return max(1.0, float(np.median([_one_ratio(step, seconds, n_cores) for _ in range(repeats)])))


def slow_down(ratios: dict, key: str, ranks_per_core: float) -> float:
    """A step's seconds on a core shared by ``ranks_per_core`` ranks over its seconds alone:
    that share times the crowd ratio measured for ``key`` (``serial``, ``tensor T``,
    ``spatial P``; a T or P not timed takes the widest timed below it, then ``serial``),
    the ratio's excess taken in proportion up to two ranks a core; 1 with a core each."""
    if ranks_per_core <= 1:
        return 1.0
    kind, _, parts = key.partition(" ")
    timed = [int(k.split()[1]) for k in ratios if k.startswith(kind + " ") and parts
             and int(k.split()[1]) <= int(parts)]
    ratio = ratios.get(f"{kind} {max(timed)}" if timed else "serial", 1.0)
    return ranks_per_core * (1.0 + (ratio - 1.0) * min(1.0, ranks_per_core - 1.0))
