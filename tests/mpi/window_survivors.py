"""Hogwild's two facts over joined jobs (a probe): RMA windows over a communicator merged
across one-rank ``mpiexec`` jobs, and RMA by the survivors after a member's SIGKILL.

``coord PATH W SECONDS KIND`` opens a port, writes it to PATH and admits W joiners (as
ring_survivors.py does), merging each; ``member PATH DIE SECONDS KIND`` is one joiner. Then
every rank creates a window collectively over the merged communicator (KIND ``shared``:
MPI_Win_allocate_shared, N float64 on rank 0; ``plain``: MPI_Win_allocate) and a counter
window (MPI_Win_allocate, one int64 on rank 0), and locks both (lock_all). Each member, for
SECONDS, adds 1.0 to every element of rank 0's window (MPI_Accumulate, SUM) and 1 to the
counter (MPI_Fetch_and_op), flushing each; member DIE SIGKILLs itself halfway. Each survivor
prints ``OPS n after_death m`` (its operations, and those that completed after it saw the
death); the coordinator prints ``WINDOW first last counter`` (rank 0's elements and counter,
read locally after the members are done). Nobody frees a window (MPI_Win_free is collective).
"""
import os
import sys
import time

from mpi4py import MPI  # noqa: E402  (UCX_TLS comes from the caller)

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from ring_survivors import admit, join, running  # noqa: E402

N, DONE, END = 4096, 4, 5


def windows(comm: MPI.Intracomm, kind: str):
    size = N * 8 if comm.Get_rank() == 0 else 0
    try:
        if kind == "shared":
            win = MPI.Win.Allocate_shared(size, 8, comm=comm)
        else:
            win = MPI.Win.Allocate(size, 8, comm=comm)
    except MPI.Exception as exc:
        print(f"WINDOW_FAILED {kind}: {exc.Get_error_string()}", flush=True)
        os._exit(3)
    counter = MPI.Win.Allocate(8 if comm.Get_rank() == 0 else 0, 8, comm=comm)
    print(f"WINDOW_MADE {kind} rank {comm.Get_rank()}", flush=True)
    return win, counter


def coord(path: str, joiners: int, seconds: float, kind: str) -> None:
    port = MPI.Open_port()
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(port)
    os.replace(path + ".tmp", path)
    comm = admit(port, path, joiners)
    pids = comm.allgather(os.getpid())
    win, counter = windows(comm, kind)
    mine = np.frombuffer(win.tomemory(), np.float64) if kind == "plain" else \
        np.frombuffer(win.Shared_query(0)[0], np.float64)
    count = np.frombuffer(counter.tomemory(), np.int64)
    mine[:] = 0
    count[:] = 0
    comm.Barrier()
    status, done = MPI.Status(), set()
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds + 30:
        while comm.Iprobe(MPI.ANY_SOURCE, DONE, status):
            comm.recv(source=status.Get_source(), tag=DONE)
            done.add(status.Get_source())
        live = {r for r in range(1, comm.Get_size()) if running(pids[r])}
        if live <= done:
            break
        time.sleep(0.01)
    win.Lock(0, MPI.LOCK_SHARED)   # a local read of its own window (sync, not an RMA to others)
    print(f"WINDOW {mine[0]:.0f} {mine[-1]:.0f} counter {int(count[0])} live {sorted(live)}",
          flush=True)
    win.Unlock(0)
    for r in live:
        comm.send(None, dest=r, tag=END)
    sys.stdout.flush()
    os._exit(0)


def member(path: str, die: int, seconds: float, kind: str) -> None:
    comm = join(path)
    pids = comm.allgather(os.getpid())
    rank = comm.Get_rank()
    win, counter = windows(comm, kind)
    comm.Barrier()
    ones, one, got = np.ones(N), np.ones(1, np.int64), np.zeros(1, np.int64)
    win.Lock_all()
    counter.Lock_all()
    ops = after = 0
    dead_seen = False
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if rank == die and time.monotonic() - t0 > seconds / 2:
            os.kill(os.getpid(), 9)
        win.Accumulate(ones, 0, op=MPI.SUM)
        win.Flush(0)
        counter.Fetch_and_op(one, got, 0, op=MPI.SUM)
        counter.Flush(0)
        ops += 1
        if not dead_seen and 0 < die < comm.Get_size() and not running(pids[die]):
            dead_seen = True
        after += dead_seen
    print(f"OPS {ops} after_death {after} rank {rank}", flush=True)
    comm.send(None, dest=0, tag=DONE)
    while not comm.Iprobe(0, END):
        if not running(pids[0]):
            break
        time.sleep(0.01)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    role, path = sys.argv[1], sys.argv[2]
    if role == "coord":
        coord(path, int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    else:
        member(path, int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
