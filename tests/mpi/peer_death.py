"""Inside one job: the last rank SIGKILLs itself; rank 0 then waits on it (recv, send, collective).

Prints one line per attempt: ``ATTEMPT what``, then ``RESULT what: ...`` if the call came back.
"""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
rank, dead = comm.Get_rank(), comm.Get_size() - 1
comm.Barrier()
if rank == dead:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(0.5)


def polled(req, limit: float) -> str:
    t = time.monotonic()
    while time.monotonic() - t < limit:
        if req.Test():
            return f"completed after {time.monotonic() - t:.2f} s"
        time.sleep(0.01)
    return f"pending after {limit:.0f} s"


def attempt(what: str, call) -> None:
    print(f"ATTEMPT {what}", flush=True)
    try:
        print(f"RESULT {what}: {call()}", flush=True)
    except MPI.Exception as e:
        print(f"RESULT {what}: error class {e.Get_error_class()}", flush=True)


if rank == 0:
    limit = float(sys.argv[1])
    buf = np.zeros(1 << 18)   # 2 MiB: past any eager limit
    attempt("irecv", lambda: polled(comm.Irecv(buf, source=dead, tag=1), limit))
    attempt("isend", lambda: polled(comm.Isend(buf, dest=dead, tag=2), limit))
    attempt("iallreduce", lambda: polled(comm.Iallreduce(MPI.IN_PLACE, buf[:4]), limit))
print(f"ALIVE {rank}", flush=True)
