"""``PSGD_*`` environment variables, read with a clear error when a value does not parse."""
from __future__ import annotations

import os

from psgd.errors import UsageError


def env_float(name: str, default: float) -> float:
    """``float(os.environ[name])``, or ``default`` when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"environment variable {name}={raw!r} is not a number") from None


def env_int(name: str, default: int) -> int:
    """``int(os.environ[name])``, or ``default`` when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"environment variable {name}={raw!r} is not an integer") from None


def ps_push_window() -> bool:
    """``PSGD_X_PS_PUSH_WINDOW``: False when set to 0 (pushes by messages only)."""
    return env_int("PSGD_X_PS_PUSH_WINDOW", 1) != 0


#: psgd's own knobs beside the flags' ``PSGD_<FLAG>`` variables: name -> what it sets
#: (docs/guide/environment.md is the table users read; a test keeps the two the same)
KNOBS = {
    "PSGD_PLUGINS": "modules to import before the command line is read (psgd.plugins)",
    "PSGD_X_FAULT": "tests: make a rank fail (psgd.mpi.faults)",
    "PSGD_X_STOP_EVERY": "clocks between stop checks (0: adaptive)",
    "PSGD_X_POLL_MAX_SLEEP": "longest sleep, in seconds, between polls of a pending request",
    "PSGD_PROGRESS": "1 or 0: show the progress bar or not (default: a guess from the terminal)",
    "PSGD_X_PS_PUSH_WINDOW": "0: bsp/ssp/asp pushes by messages only, never the shared window",
    "PSGD_X_HOGWILD_WINDOW": "hogwild's parameter window: auto, shared or allocate",
    "PSGD_X_HOGWILD_SPARSE": "off: hogwild moves a sparse model's whole vector",
    "PSGD_X_HOGWILD_FUSED": "off: hogwild never fuses a sparse model's steps into runs",
    "PSGD_X_ALLREDUCE_SMALL_BYTES": "all-reduce: below this, recursive doubling instead of the ring",
    "PSGD_X_ALLREDUCE_SEGMENT_BYTES": "all-reduce: the ring's segment size",
    "PSGD_X_ALLREDUCE_SHARED_BYTES": "all-reduce: the node's shared window size (0: messages only)",
    "PSGD_X_ALLREDUCE_CHUNK_BYTES": "hierarchical all-reduce: the pipeline's chunk size",
    "PSGD_X_ALLREDUCE_PIECE_BYTES": "shared-window all-reduce: the piece each rank sums",
    "PSGD_X_ALLREDUCE_SPIN_US": "all-reduce: microseconds to spin before sleeping on a flag",
    "PSGD_X_PIPELINE_SPIN_US": "pipeline: microseconds to spin before sleeping on a neighbour's message",
    "PSGD_X_CROWD_SECONDS": "psgd plan's profile: seconds of steps behind each crowd ratio",
    "PSGD_X_CROWD_REPEATS": "psgd plan's profile: rounds whose median is each crowd ratio",
    "PSGD_MPIEXEC": "the launcher psgd demo and the tests start (default: the venv's mpiexec)",
    "PSGD_DEMO_DIR": "where psgd demo writes (default demo/)",
    "PSGD_X_TEST_MARK": "tests: marks the processes a test started",
    "PSGD_X_PAIRS_DUMP": "tests: elastic adpsgd writes its members' parameters to this .npz",
    "PSGD_X_REPLICA_TRACE": "tests: server replicas write their records of applied updates here",
    "PSGD_X_REPLICA_KILL": "tests: the primary server SIGKILLs itself mid-forward of push N",
    "PSGD_X_NET": "set by psgd net: its link's bits/s (or none) and its nodes, RATE,NODES",
}


def psgd_variables(flag_variables, environ=os.environ) -> tuple[dict, list]:
    """The ``PSGD_*`` variables set in ``environ``: (those psgd reads, name -> value; the
    names it does not know, which it ignores). ``flag_variables``: the flags' names."""
    known, unknown = {}, []
    for name, value in sorted(environ.items()):
        if not name.startswith("PSGD_"):
            continue
        if name in KNOBS or name in flag_variables:
            known[name] = value
        else:
            unknown.append(name)
    return known, unknown
