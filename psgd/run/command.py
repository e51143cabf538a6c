"""`psgd train`: its flags and help, and the job it runs (imported only then, so --help starts no MPI)."""
from __future__ import annotations

import argparse

from psgd.run.settings import DESCRIPTION, add_arguments

__all__ = ["DESCRIPTION", "add_arguments", "run"]


def run(args: argparse.Namespace) -> None:
    from psgd.run.job import train_main
    train_main(args)
