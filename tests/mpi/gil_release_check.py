"""Whether mpi4py releases the GIL in each blocking set-up/teardown call psgd makes (run with 2 ranks).

Rank 1 comes to each call LATE seconds after rank 0; meanwhile a thread on rank 0
counts ticks. Rank 0 prints one line per call: ``CALL blocked S s, ticks N``
(a held GIL: about 0 ticks), then ``threads: LEVEL``.
"""
import threading
import time

import numpy as np
from mpi4py import MPI

LATE = 0.6
TICK = 0.01


def calls(comm):
    rank = comm.Get_rank()
    buf, out = np.zeros(4, np.float32), np.zeros(4 * comm.Get_size(), np.float32)
    local = np.zeros(16, np.float32)
    yield "Barrier", comm.Barrier
    yield "Bcast", lambda: comm.Bcast(buf, root=1)
    yield "Allgather", lambda: comm.Allgather(buf, out)
    yield "Split_type", lambda: comm.Split_type(MPI.COMM_TYPE_SHARED)
    yield "Comm_split", lambda: comm.Split(0, rank)
    yield "Comm_dup", comm.Dup
    yield "Win_allocate_shared", lambda: MPI.Win.Allocate_shared(64, 4, comm=comm)
    yield "Win_allocate", lambda: MPI.Win.Allocate(64, 4, comm=comm)
    yield "Win_create", lambda: MPI.Win.Create(local, 4, comm=comm)
    yield "Dist_graph_create_adjacent", lambda: comm.Create_dist_graph_adjacent(
        [1 - rank], [1 - rank], reorder=False)


def timed(comm, name, fn, ticks):
    comm.Barrier()
    if comm.Get_rank() == 1:
        time.sleep(LATE)
    before, t0 = ticks[0], time.monotonic()
    made = fn()
    if comm.Get_rank() == 0:
        print(f"{name} blocked {time.monotonic() - t0:.2f} s, ticks {ticks[0] - before}",
              flush=True)
    return made


def main():
    comm = MPI.COMM_WORLD
    ticks, done = [0], threading.Event()

    def tick():
        while not done.wait(TICK):
            ticks[0] += 1

    threading.Thread(target=tick, daemon=True).start()
    made = [timed(comm, name, fn, ticks) for name, fn in calls(comm)]
    for obj in made:
        if isinstance(obj, MPI.Win):
            timed(comm, "Win_free", obj.Free, ticks)
    done.set()
    if comm.Get_rank() == 0:
        level = {MPI.THREAD_MULTIPLE: "multiple", MPI.THREAD_SERIALIZED: "serialized",
                 MPI.THREAD_FUNNELED: "funneled", MPI.THREAD_SINGLE: "single"}[MPI.Query_thread()]
        print(f"threads: {level}", flush=True)


if __name__ == "__main__":
    main()
