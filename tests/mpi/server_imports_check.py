"""Run `psgd train ARGS` in this process on every rank, then say whether the rank loaded numba.

    mpiexec -n N python server_imports_check.py train ... --servers S ...
"""
import sys

from mpi4py import MPI

from psgd.cli import main

args = sys.argv[1:]
main(args)
servers = int(args[args.index("--servers") + 1])
rank = MPI.COMM_WORLD.Get_rank()
role = "server" if rank < servers else "worker"
loaded = "loaded" if "numba" in sys.modules else "not loaded"
sys.stdout.write(f"rank {rank} {role}: numba {loaded}\n")   # one write: ranks share the stream
sys.stdout.flush()
