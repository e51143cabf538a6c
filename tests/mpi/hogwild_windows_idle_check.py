"""A hogwild server making its windows waits for a late worker without spinning (run with 2 ranks)."""
import time

from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.hogwild.windows import Windows
from psgd.mpi.roles import assign_roles
from psgd.mpi.shardmap import ShardMap


def main():
    roles = assign_roles(MPI.COMM_WORLD, 1)
    if roles.is_worker:
        time.sleep(1.0)   # a worker still importing its kernels or reading its data
    t0, cpu0 = time.perf_counter(), time.process_time()
    windows = Windows(roles, ShardMap(1000, 1), None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    windows.free()
    if roles.is_server:
        print(f"server making the windows: wall {wall:.2f} s cpu {cpu:.3f} s", flush=True)
        assert wall > 0.5, "the server did not wait for the worker"
        assert cpu / wall < 0.25, f"the waiting server used {cpu:.2f} s CPU in {wall:.2f} s"


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001
        report_and_abort(exc)
