"""A ring all-reduce over separate jobs that goes on without a killed member (a probe).

``coord PORT W CLOCKS`` opens a port and admits W one-rank joiner jobs one at a time,
merging each into one intracommunicator (rank 0: this coordinator, ranks 1..W: the ring).
``ring PORT DIE WHEN CLOCKS SEG`` is one joiner: each clock it adds ``rank + 1000 * clock`` into a
ring all-reduce (W - 1 pass-along steps, every message SEG float64 at most); rank DIE (when
0 < DIE <= W) SIGKILLs itself at clock CLOCKS // 2, WHEN ("before" or "after") its first step's sends.

Survivors watch every member's pid (``/proc``, no MPI), and on a death cancel their receives
and report to the coordinator the clock they were in. The survivors can be one clock apart
(the dead one's last messages may have reached some of them), so the coordinator, once every
live member reported, names the new ring, the clock to redo (the lowest reported) and a
member that finished it, whose result that clock keeps; it is then the sum over the old ring
for everybody. Each survivor prints ``SUMS`` with one sum per clock, and ``RING`` with the
members of each clock's sum, so a test checks them against the numbers each rank added.

Under MPICH's UCX a survivor's next send can die of SIGSEGV once UCX notices the death
through a transport that sees it (tcp among the defaults); with ``UCX_TLS=posix,sysv,self``
(one node, shared memory only) none did. Under ch4:ofi the survivors abort with "OFI poll
failed" even with MPI_ERRORS_RETURN (docs/design/elastic.md).
"""
import glob
import json
import os
import sys
import time

os.environ.setdefault("UCX_TLS", "^cma")
from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

N, REPORT, DECIDE, RESULT, DONE, END = 4096, 1, 2, 3, 4, 5
TAG_BASE = 16   # ring tags: TAG_BASE + (epoch * 2 ** 12 + clock % 2 ** 12) * 64 + step % 64


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):   # ESRCH: it ended while being read
        return False


def admit(port: str, path: str, joiners: int) -> MPI.Intracomm:
    """One joiner at a time (two connecting at once crash MPICH): knock, turn, ready."""
    comm = MPI.COMM_SELF
    for k in range(joiners):
        while not (knocks := sorted(glob.glob(path + ".knock.*"))):
            time.sleep(0.02)
        name = knocks[0].split(".knock.")[1]
        os.replace(knocks[0], path + ".turn." + name)
        while not os.path.exists(path + ".ready." + name):
            time.sleep(0.01)
        os.unlink(path + ".ready." + name)
        comm = comm.Accept(port, root=0).Merge(high=False)
        comm.bcast(joiners - k - 1, root=0)
    return comm


def join(path: str) -> MPI.Intracomm:
    name = str(os.getpid())
    open(path + ".knock." + name, "w").close()
    while not os.path.exists(path + ".turn." + name):
        time.sleep(0.02)
    os.replace(path + ".turn." + name, path + ".ready." + name)
    port = open(path, encoding="utf-8").read().strip()
    comm = MPI.COMM_SELF.Connect(port, root=0).Merge(high=True)
    while comm.bcast(None, root=0):
        comm = comm.Accept(None, root=0).Merge(high=False)
    for c in (comm, MPI.COMM_WORLD, MPI.COMM_SELF):   # a request's error may go to either
        c.Set_errhandler(MPI.ERRORS_RETURN)
    return comm


def coordinate(comm: MPI.Intracomm, pids: list, clocks: int) -> None:
    ring, epoch, reports, status = list(range(1, comm.Get_size())), 0, {}, MPI.Status()
    finished = set()
    while finished != set(ring):
        if comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
            source, tag = status.Get_source(), status.Get_tag()
            (reports if tag == REPORT else {})[source] = comm.recv(source=source, tag=tag)
            if tag == DONE:
                finished.add(source)
        live = [r for r in ring if running(pids[r])]
        if reports and set(reports) >= set(live):
            low = min(reports[r] for r in live)
            done = [r for r in live if reports[r] > low]
            epoch += 1
            behind = [r for r in live if reports[r] == low] if done else []
            decision = (epoch, live, low, done[0] if done else 0, behind)
            print(f"DECIDE epoch {epoch}: ring {live}, redo clock {low}, result from "
                  f"{decision[3] or 'nobody'}", flush=True)
            for r in live:
                comm.send(decision, dest=r, tag=DECIDE)
            ring, reports = live, {}
        time.sleep(0.001)
    for r in ring:   # nobody leaves before all are done: a finished member's pid stays
        comm.send(None, dest=r, tag=END)
    print("COORD DONE", flush=True)


class Lost(Exception):
    pass


def ring_sum(comm, ring, rank, epoch, clock, x, pids, die_when) -> np.ndarray:
    """Sum of every member's ``x`` over ``ring``: pass the last received along W - 1 times."""
    i = ring.index(rank)
    nxt, prv = ring[(i + 1) % len(ring)], ring[i - 1]
    total, out = x.copy(), x.copy()
    for step in range(len(ring) - 1):
        tag = TAG_BASE + ((epoch * 2 ** 12 + clock % 2 ** 12) * 64 + step % 64)
        got = np.empty_like(out)
        segs = range(0, out.size, SEG)
        if die_when == "before":
            os.kill(os.getpid(), 9)
        if not running(pids[nxt]):   # MPICH's Isend to a peer dead for a while can SIGSEGV
            raise Lost
        recvs = []
        try:
            recvs = [comm.Irecv(got[a:a + SEG], source=prv, tag=tag) for a in segs]
            sends = [comm.Isend(out[a:a + SEG], dest=nxt, tag=tag) for a in segs]
            if die_when == "after":
                os.kill(os.getpid(), 9)
            while not MPI.Request.Testall(recvs + sends):
                if not all(running(pids[r]) for r in ring):
                    raise Lost
        except (Lost, MPI.Exception) as why:   # ch4:ofi returns an error for a dead peer
            for r in recvs:
                try:
                    if r:   # a completed request is already null
                        r.Cancel()
                except MPI.Exception:
                    pass
            raise Lost from why
        total += got
        out = got
    return total


def train(comm, die, die_when, clocks) -> None:
    rank = comm.Get_rank()
    pids = comm.allgather(os.getpid())
    ring, epoch, clock, sums, rings = list(range(1, comm.Get_size())), 0, 0, {}, {}
    while clock < clocks:
        x = np.full(N, float(rank + 1000 * clock))
        try:
            sums[clock] = ring_sum(comm, ring, rank, epoch, clock, x, pids,
                                   die_when if rank == die and clock == clocks // 2 else "")
            rings[clock] = ring
            clock += 1
        except Lost:
            comm.send(clock, dest=0, tag=REPORT)
            epoch, ring, low, source, behind = comm.recv(source=0, tag=DECIDE)
            if source == rank:   # it finished the clock the others were in: its sum stands
                for r in behind:
                    comm.send((sums[low], rings[low]), dest=r, tag=RESULT)
            elif rank in behind:
                sums[low], rings[low] = comm.recv(source=source, tag=RESULT)
            clock = low + 1 if source else low
    comm.send(None, dest=0, tag=DONE)
    comm.recv(source=0, tag=END)
    print("SUMS " + json.dumps([float(sums[c][0]) for c in range(clocks)]), flush=True)
    print("RING " + json.dumps([rings[c] for c in range(clocks)]), flush=True)
    print(f"RANK {rank} DONE", flush=True)


if __name__ == "__main__":
    role, path = sys.argv[1], sys.argv[2]
    if role == "coord":
        W, clocks = int(sys.argv[3]), int(sys.argv[4])
        port = MPI.Open_port()
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(port)
        os.replace(path + ".tmp", path)
        comm = admit(port, path, W)
        coordinate(comm, comm.allgather(os.getpid()), clocks)
    else:
        die, die_when, clocks = int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
        SEG = int(sys.argv[6])
        comm = join(path)
        train(comm, die, die_when, clocks)
    sys.stdout.flush()
    os._exit(0)   # MPI_Finalize would wait on the dead member
