"""The flags `psgd train --elastic` adds (no MPI here: --help imports this)."""
from __future__ import annotations

import argparse

from psgd.errors import UsageError

DEFAULT_MAX_WORKERS = 16
DEFAULT_NO_WORKER_S = 300.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "elastic training", "run the servers alone; workers join with `psgd join --port-file F` "
        "from mpiexec -n 1 jobs of their own (docs/guide/elastic.md)")
    group.add_argument("--elastic", action="store_true", default=None,
                       help="run as the server job of an elastic run (--protocol asp, ssp "
                            "or bsp; the servers only: mpiexec -n S, --servers S): workers "
                            "join and leave while it trains, a worker silent longer than "
                            "--stall-timeout is dropped, and --steps or --epochs count the "
                            "servers' updates over all workers")
    group.add_argument("--port-file", metavar="PATH",
                       help="--elastic: write the servers' MPI port name here; `psgd join "
                            "--port-file PATH` reads it (and knocks beside it)")
    group.add_argument("--max-workers", type=int, metavar="N",
                       help=f"--elastic: the most workers that may join over the run, a lost "
                            f"one's place not reused (default {DEFAULT_MAX_WORKERS})")
    group.add_argument("--no-worker-timeout", type=float, metavar="SECONDS",
                       help=f"--elastic: end the run (with a checkpoint, exit 1) after this long "
                            f"with no worker connected (default {DEFAULT_NO_WORKER_S:g})")


def check(args: argparse.Namespace) -> None:
    """Raise ValueError when an elastic flag is given without --elastic, or out of range."""
    given = [flag for flag, value in (("--port-file", args.port_file),
                                      ("--max-workers", args.max_workers),
                                      ("--no-worker-timeout", args.no_worker_timeout))
             if value is not None]
    if given and not args.elastic:
        raise UsageError(f"{given[0]} applies with --elastic only")
    if args.max_workers is not None and args.max_workers < 1:
        raise UsageError(f"--max-workers must be >= 1, got {args.max_workers}")
    if args.no_worker_timeout is not None and not args.no_worker_timeout > 0:
        raise UsageError(f"--no-worker-timeout must be > 0, got {args.no_worker_timeout}")
