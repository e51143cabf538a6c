"""Rank 1 waits for a message rank 0 never sends: a stall report, then the job ends (run with 2 ranks)."""
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.mpi import wait


def main():
    comm = MPI.COMM_WORLD
    wait.configure(stall_timeout=0.5, stall_abort=2.0)
    if comm.Get_rank() == 1:
        status = MPI.Status()
        wait.probe(comm, 0, 77, status, "rank 0 to push clock 5 of shard 0")
    else:
        wait.barrier(comm, "rank 1 at the barrier")  # never completes: rank 1 aborts the job


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001
        report_and_abort(exc)
