"""`psgd train`: its flags and help, and the job it runs (imported only then, so --help starts no MPI)."""
from __future__ import annotations

import argparse
import sys

from psgd.env import env_float
from psgd.run import plan_job, settings
from psgd.run.mode_flags import ElasticOptions, PipelineFlags
from psgd.run.run_plan import RunPlan
from psgd.run.settings import DESCRIPTION

__all__ = ["DESCRIPTION", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    settings.add_arguments(parser)
    plan_job.add_arguments(parser)


def run(args: argparse.Namespace) -> None:
    from psgd.errors import launcher_rank
    from psgd.run import init_watch

    try:   # a pipeline or elastic flag without its mode: a usage error, printed once, before MPI
        plan_job.check(args)   # --plan auto takes --memory-per-rank for itself
        given = _given(args)
        PipelineFlags.from_flat(given).check_given()
        ElasticOptions.from_flat(given).check_given()
    except ValueError as exc:
        if launcher_rank() == 0:
            print(f"psgd train: error: {exc} (see --help)", file=sys.stderr, flush=True)
        sys.exit(2)

    elastic = bool(given.get("elastic"))
    if elastic:
        from psgd.elastic import no_cross_memory_attach
        no_cross_memory_attach(given.get("protocol"))
    # the flags as given (the config file is read later); MPI_Init is the import of job
    timeout = args.stall_timeout or env_float("PSGD_STALL_TIMEOUT", RunPlan.stall_timeout)
    abort = args.stall_abort or env_float("PSGD_STALL_ABORT", RunPlan.stall_abort)
    initialised = init_watch.start(timeout, abort, launcher_rank())
    from psgd.mpi import wait
    from psgd.run.job import train_main
    initialised()
    wait.configure(stall_timeout=timeout, stall_abort=abort)   # until the settings are agreed
    if args.plan is not None:
        from mpi4py import MPI
        plan_job.choose(args, MPI.COMM_WORLD)
    if args.pipeline is not None or given.get("pipeline") is not None:   # --plan sets the flag
        from psgd.run.pipeline_job import train_pipeline
        train_pipeline(args)
        return
    if elastic:
        from psgd.elastic.serve import serve_main
        return serve_main(args)
    train_main(args)


def _given(args: argparse.Namespace) -> dict:
    """The settings given by flag, TOML config or variable; {} where one is bad (reported once
    the settings are resolved, after MPI starts)."""
    try:
        return settings.given_settings(args)
    except ValueError:
        return {}
