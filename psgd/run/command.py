"""`psgd train`: its flags and help, and the job it runs (imported only then, so --help starts no MPI)."""
from __future__ import annotations

import argparse

from psgd.elastic import options as elastic_options
from psgd.env import env_float
from psgd.run.settings import DESCRIPTION, TrainSettings
from psgd.run.settings import add_arguments as add_settings

__all__ = ["DESCRIPTION", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_settings(parser)
    elastic_options.add_arguments(parser)


def run(args: argparse.Namespace) -> None:
    from psgd.errors import launcher_rank
    from psgd.run import init_watch

    # the flags as given (the config file is read later); MPI_Init is the import of job
    timeout = args.stall_timeout or env_float("PSGD_STALL_TIMEOUT", TrainSettings.stall_timeout)
    abort = args.stall_abort or env_float("PSGD_STALL_ABORT", TrainSettings.stall_abort)
    initialised = init_watch.start(timeout, abort, launcher_rank())
    from psgd.mpi import wait
    from psgd.run.job import train_main
    initialised()
    wait.configure(stall_timeout=timeout, stall_abort=abort)   # until the settings are agreed
    if getattr(args, "elastic", None):
        from psgd.elastic.serve import serve_main
        return serve_main(args)
    if hasattr(args, "elastic"):
        elastic_options.check(args)
    train_main(args)
