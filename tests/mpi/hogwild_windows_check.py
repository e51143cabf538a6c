"""Hogwild windows on 1 server + 1 worker: a server making them waits for a late worker without
spinning, and it sees the worker's finished flag by a plain load (run with 2 ranks)."""
import time

import numpy as np
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.hogwild.windows import Windows
from psgd.mpi import wait
from psgd.mpi.roles import assign_roles
from psgd.mpi.shardmap import ShardMap


def main():
    roles = assign_roles(MPI.COMM_WORLD, 1)
    if roles.is_worker:
        time.sleep(1.0)   # a worker still importing its kernels or reading its data
    t0, cpu0 = time.perf_counter(), time.process_time()
    windows = Windows(roles, ShardMap(1000, 1), "shared")
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if roles.is_server:
        print(f"server making the windows: wall {wall:.2f} s cpu {cpu:.3f} s", flush=True)
        assert wall > 0.5, "the server did not wait for the worker"
        assert cpu / wall < 0.25, f"the waiting server used {cpu:.2f} s CPU in {wall:.2f} s"
        assert not windows.any_finished()
    wait.barrier(roles.comm)
    if roles.is_worker:   # the finished flag as HogwildWorker.finish sets it
        windows.counter.Lock_all()
        windows.counter.Accumulate([np.ones(1, np.int64), MPI.INT64_T], 0, (1, 1, MPI.INT64_T),
                                   MPI.SUM)
        windows.counter.Flush(0)
        windows.counter.Unlock_all()
    wait.barrier(roles.comm)
    if roles.is_server:
        assert windows.any_finished(), windows.count
        print("server sees the finished flag", flush=True)
    windows.free()


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001
        report_and_abort(exc)
