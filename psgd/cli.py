"""`python -m psgd {train,data,plot}`: argument parsing and the failure rule around every command.

Each subcommand lives in its own module, which exposes ``add_arguments(parser)``
and ``run(args)``; modules are imported lazily so that ``psgd data`` never
initialises MPI and ``--help`` is fast.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import sys

# Each rank is one process on one core: pin BLAS (which numba's np.dot calls) to one
# thread before any command imports numpy, unless the user chose otherwise (N ranks
# with a BLAS thread per core each oversubscribe the node; docs/results/report.md has the cost).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import psgd  # noqa: E402
from psgd import plugins  # noqa: E402
from psgd.errors import launcher_rank, report_and_abort  # noqa: E402

# name -> (module, one-line help)
COMMANDS = {
    "train": ("psgd.run.command", "train a model under mpiexec/srun (one process per rank)"),
    "data": ("psgd.data.cli", "make, convert and inspect HDF5 datasets"),
    "join": ("psgd.elastic.join", "join a running elastic run (psgd train --elastic) as one worker"),
    "plot": ("psgd.plot", "draw PNG charts from JSON-lines training logs"),
    "plan": ("psgd.plan.command", "predict each protocol's throughput on a cluster and pick one"),
    "simulate": ("psgd.simulate.command", "simulate a protocol at W workers: throughput, staleness, "
                 "training along the simulated order"),
    "net": ("psgd.run.net", "run a command on N emulated nodes behind a rate-limited network"),
}


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are printed by rank 0 only (one line, exit 2)."""

    def error(self, message: str) -> None:  # noqa: D102
        if launcher_rank() == 0:
            print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr, flush=True)
        sys.exit(2)


def _chosen_command(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not an option)."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with ``argv`` only the command it names is imported (without, all are)."""
    lazy = argv is not None
    chosen = _chosen_command(argv) if lazy else None
    parser = _Parser(prog="psgd", description="psgd: an MPI parameter server, asynchronous and "
                     "synchronous SGD, and ring all-reduce")
    parser.add_argument("--debug", action="store_true", help="print full tracebacks on error")
    parser.add_argument("--version", action="version", version=f"psgd {psgd.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser,
                                required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if lazy and chosen != name:
            sub.add_parser(name, help=help_text)  # not imported: only listed in --help
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text, description=getattr(module, "DESCRIPTION", help_text),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print full tracebacks on error")
        module.add_arguments(p)
        p.set_defaults(_module=module_name)
    return parser


def main_and_exit() -> None:
    """:func:`main` as a process's entry point (``python -m psgd``, the ``psgd`` script).

    After ``psgd train`` returns, Python's exit handlers run and MPI is finalized as at any
    exit, stdout and stderr are flushed, and the C library's ``exit`` ends the process (its
    handlers run: HDF5's, MPICH's) without Python tearing down its modules one by one (with
    numba, h5py and MPI loaded that takes a while; the run has closed its files by then).
    ``os._exit`` instead skipped those C handlers, and then mpiexec killed an ssp run's rank
    (signal 9) now and then. Other commands, and a run that exits otherwise, exit as usual.
    """
    main()
    if _chosen_command(sys.argv[1:]) != "train":
        return
    import atexit
    atexit._run_exitfuncs()
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe: Python's own exit would say nothing either
            os._exit(1)
    ctypes.CDLL(None).exit(0)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if _chosen_command(argv) == "train":   # a stop signal from the first moment on
        from psgd.run.signals import install
        install()
    try:
        plugins.load()   # before the parser: their protocols, compressors and layers show in --help
    except Exception as exc:  # noqa: BLE001 - a plugin that fails to load ends every rank
        report_and_abort(exc, debug="--debug" in argv, code=2, values_are_usage=True)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    debug = bool(getattr(args, "debug", False))
    try:
        importlib.import_module(args._module).run(args)
    except SystemExit:
        raise
    except BrokenPipeError:
        # the reader of stdout went away (`psgd data info F | head -1`): stop quietly, and keep
        # Python's final flush from printing another BrokenPipeError
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except KeyboardInterrupt:
        # Ctrl-C before `psgd train` catches it (or in another command): every rank got it
        if launcher_rank() == 0:
            print("psgd: interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    except BaseException as exc:  # noqa: BLE001 - the failure rule: report, end every rank
        # a training rank's ValueError after set-up (which reports its own) is a bug
        report_and_abort(exc, debug=debug, values_are_usage=args.command != "train")
