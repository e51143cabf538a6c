"""A joiner job: connects to the port in argv[1], sends argv[2] messages, then SIGKILLs itself."""
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

with open(sys.argv[1]) as f:
    inter = MPI.COMM_SELF.Connect(f.read())
for i in range(int(sys.argv[2])):
    inter.Send(np.full(4, float(i)), dest=0, tag=1)
    time.sleep(0.05)
print("JOINER SENT", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
