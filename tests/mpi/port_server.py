"""One server rank: opens a port (written to argv[1]), admits joiners from other jobs on a thread,
and drains each joiner's messages until it has been silent for argv[2] seconds."""
import os
import sys
import threading
import time

import mpi4py

mpi4py.rc.thread_level = "multiple"
from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

path, silent_s, expected = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
port = MPI.Open_port()
with open(path + ".tmp", "w") as f:
    f.write(port)
os.rename(path + ".tmp", path)
joined: list = []


def admit() -> None:
    while len(joined) < expected:
        inter = MPI.COMM_SELF.Accept(port)
        inter.Set_errhandler(MPI.ERRORS_RETURN)
        joined.append(inter)
        print(f"ADMITTED {len(joined)}", flush=True)


threading.Thread(target=admit, daemon=True).start()
for k in range(expected):
    while len(joined) <= k:
        time.sleep(0.01)
    buf, got, t = np.zeros(4), 0, time.monotonic()
    req = joined[k].Irecv(buf, source=0, tag=1)
    while time.monotonic() - t < silent_s:
        if req.Test():
            got, t = got + 1, time.monotonic()
            req = joined[k].Irecv(buf, source=0, tag=1)
        time.sleep(0.01)
    print(f"SILENT {k + 1} after {got} messages", flush=True)
print("SERVER ALIVE", flush=True)
os._exit(0)   # the dead joiners' requests stay pending; MPI_Finalize would wait on them
