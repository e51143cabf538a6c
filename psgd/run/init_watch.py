"""A watchdog for MPI_Init, which blocks (holding the GIL) until every rank has started MPI.

A rank stopped or stuck before MPI_Init leaves the others inside it, where no
Python code runs. A forked child process watches instead: past the stall
timeout it reports, past the abort limit it kills this rank, which makes the
launcher end the job.
"""
from __future__ import annotations

import glob
import os
import select
import signal
import sys
import time


def start(stall_timeout: float, stall_abort: float, rank: int):
    """Fork the watchdog; call the returned function once MPI is initialised."""
    if "mpi4py.MPI" in sys.modules:   # MPI is up already (psgd called in-process)
        return lambda: None
    stale = _mpich_segments_of_this_step()
    read_end, write_end = os.pipe()
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        os.close(write_end)
        _watch(read_end, parent, rank, stall_timeout, stall_abort, stale)
        os._exit(0)
    os.close(read_end)

    def done() -> None:
        os.close(write_end)   # EOF: the watchdog exits
        os.waitpid(child, 0)

    return done


def _mpich_segments_of_this_step() -> list[str]:
    """The shared-memory files MPICH would open for this srun step, if they exist already.

    MPICH names a node's segment after the FNV-1a hash of its PMI name, under
    srun JOBID.STEPID; a file of that name left by a killed step with the same
    ids (a Slurm whose job ids started again) makes MPI_Init wait forever.
    """
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    if not (job and step):
        return []
    h = 2166136261
    for byte in f"{job}.{step}".encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return sorted(glob.glob(f"/dev/shm/mpich_shm_{h:x}_*"))


def _watch(read_end: int, parent: int, rank: int, stall_timeout: float, stall_abort: float,
           stale: list[str]) -> None:
    start, reported = time.monotonic(), False
    while True:
        limit = stall_abort if reported else min(stall_timeout, stall_abort)
        left = limit - (time.monotonic() - start)
        if left > 0 and select.select([read_end], [], [], left)[0]:
            return    # the rank initialised MPI, or ended
        if left > 0:
            continue
        waited = time.monotonic() - start
        what = "MPI_Init (the other ranks to start MPI; one may be stopped or stuck)"
        if stale:
            what = (f"MPI_Init: {' '.join(stale)} existed before this rank started MPI; if a "
                    f"killed job step of the same id left it, MPICH waits on it forever: remove it")
        if waited < stall_abort:
            print(f"psgd: rank {rank} stalled: waiting {waited:.0f} s for {what}",
                  file=sys.stderr, flush=True)
            reported = True
            continue
        print(f"psgd: error: rank {rank}: waited {waited:.0f} s (> stall abort limit "
              f"{stall_abort:g} s) for {what}", file=sys.stderr, flush=True)
        os.kill(parent, signal.SIGKILL)
        return
