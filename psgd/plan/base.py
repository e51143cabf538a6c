"""The bytes a training rank holds besides the memory model's training state: Python, numpy,
numba and its compiled kernels, MPI, h5py, psgd's run modules. Read from this process's
resident set after the profile (which compiled the kernels), in the rank itself under
``psgd train --plan auto``, plus an allowance for what a run adds to that (its reader,
MPI's buffers for its peers, the step's transients), measured against runs.
"""
from __future__ import annotations

import ctypes
import gc
import importlib
import resource

# what a training rank imports besides the profile's modules
RUN_MODULES = ("mpi4py.MPI", "h5py", "psgd.data.reader", "psgd.run.job")
# a short 2-rank all-reduce run's peak resident set, less its training state (the layers'
# scratch included) and data slice, over what its rank 0 read here beforehand: the most over
# four models, rounded up (docs/design/plan-search.md)
RUN_ALLOWANCE = 16 << 20


def resident() -> int:
    """This process's resident bytes now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def measure() -> int:
    """A rank's base: this process's resident bytes with a training rank's modules loaded, plus
    :data:`RUN_ALLOWANCE`. Call it after the profile, in the process that will train when
    there is one."""
    for name in RUN_MODULES:
        importlib.import_module(name)
    gc.collect()
    _trim()
    return resident() + RUN_ALLOWANCE


def _trim() -> None:
    """Hand the heap's free pages back (glibc), so that what the profile freed is not read."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except AttributeError:    # not glibc
        pass
