"""A rank waiting inside allreduce for a late neighbour sleeps instead of burning its core,
and says whom it waits for (every algorithm, both schedules of the shared-memory one)."""
import time

import numpy as np
from mpi4py import MPI

from psgd.collectives.allreduce import allreduce
from psgd.errors import report_and_abort
from psgd.mpi import wait

comm = MPI.COMM_WORLD
rank = comm.Get_rank()


def use(c):
    """Wait on communicator ``c`` (COMM_WORLD, or one of ring_suite.py's sub-communicators)."""
    global comm, rank
    comm, rank = c, c.Get_rank()
LATE_S = 1.5


def one_node():
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == comm.Get_size()
    finally:
        node.Free()


def main():
    wait.configure(stall_timeout=0.5)        # the late rank is reported (stderr)
    cases = ((100, "doubling"), (1 << 20, "ring"), (100, "shared"), (1 << 20, "shared"))
    if not one_node():                       # across emulated nodes: the pipelined hierarchical
        cases = ((1 << 20, "hierarchical"),)
    for n, algorithm in cases:
        buf = np.ones(n, np.float32)
        allreduce(comm, buf, algorithm=algorithm)   # first call: Dup, scratch, window
        comm.Barrier()
        if rank == 1:
            time.sleep(LATE_S)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        allreduce(comm, buf, algorithm=algorithm)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        if rank == 0:
            assert wall > 0.8 * LATE_S, f"n={n}: rank 0 did not wait ({wall:.2f} s)"
            assert cpu < 0.25 * wall, f"n={n}: rank 0 used {cpu:.2f} s CPU waiting {wall:.2f} s"
            print(f"{algorithm} n={n}: waited {wall:.2f} s on {cpu:.3f} s CPU")
    if rank == 0:
        print("ring_idle: passed")


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - one failing rank ends the job
        report_and_abort(exc)
