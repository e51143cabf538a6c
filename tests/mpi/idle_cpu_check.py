"""A rank waiting in psgd.mpi.wait uses little CPU while another works (run with 2 ranks)."""
import time

import numpy as np
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.mpi import wait


def main():
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        time.sleep(2.0)
        comm.Send(np.ones(4), dest=1, tag=5)
    else:
        buf = np.empty(4)
        t0, cpu0 = time.perf_counter(), time.process_time()
        wait.wait(comm.Irecv(buf, source=0, tag=5), "rank 0")
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        print(f"idle wait: wall {wall:.2f} s cpu {cpu:.3f} s fraction {cpu / wall:.3f}", flush=True)
        assert buf.sum() == 4
        assert cpu / wall < 0.25, f"waiting rank used {cpu:.2f} s CPU in {wall:.2f} s"


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001
        report_and_abort(exc)
