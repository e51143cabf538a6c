"""A joiner's first words with an elastic run: the port file's port, and the servers' welcome."""
from __future__ import annotations

import json
import time

import numpy as np

from psgd.errors import UsageError


def read_port(path: str) -> tuple[str, str]:
    """The servers' port name, and the ``UCX_TLS=...`` line of a ring ("" if none)."""
    try:
        with open(path, encoding="utf-8") as fh:
            port, _, transports = fh.read().strip().partition("\n")
    except FileNotFoundError:
        raise UsageError(f"--port-file {path}: no such file (is the server job running? it "
                         f"writes the file once its port is open, and removes it at the end)"
                         ) from None
    if not port:
        raise UsageError(f"--port-file {path} is empty")
    return port, transports.strip()


def receive_welcome(inter, wait_s: float) -> dict:
    """The servers' first message: the run's settings, this worker's slot and first clock."""
    from mpi4py import MPI

    from psgd.elastic.server import TAG_WELCOME
    status, deadline = MPI.Status(), time.monotonic() + wait_s
    while (msg := inter.Improbe(0, TAG_WELCOME, status)) is None:
        if time.monotonic() > deadline:
            raise UsageError(f"no welcome from the servers within {wait_s:g} s (--wait)")
        time.sleep(0.01)
    buf = np.empty(status.Get_count(MPI.BYTE), np.uint8)
    msg.Recv(buf)
    welcome = json.loads(bytes(buf).decode())
    if "refused" in welcome:
        raise UsageError(f"the servers refused this worker: {welcome['refused']}")
    return welcome
