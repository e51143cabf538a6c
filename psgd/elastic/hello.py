"""A joiner's first words with an elastic run: the port file's port, and the servers' welcome."""
from __future__ import annotations

import hashlib
import json
import math
import os
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


def connect_port(port: str, wait_s: float, what: str):
    """``MPI.COMM_SELF.Connect(port)`` that gives up after ``wait_s`` seconds (MPI's ``timeout``
    info key; MPICH's default is 180 s) with a :class:`UsageError` naming ``what`` it joined."""
    from mpi4py import MPI
    info = MPI.Info.Create()
    info.Set("timeout", str(max(1, math.ceil(wait_s))))
    try:
        return MPI.COMM_SELF.Connect(port, info)
    except MPI.Exception as exc:
        why = MPI.Get_error_string(exc.Get_error_class())
        raise UsageError(f"the connection to {what} did not complete within {wait_s:g} s "
                         f"(--wait; MPI: {why})") from None
    finally:
        info.Free()


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


def claims(model: str | None, data: str | None, protocol: str | None) -> dict:
    """What a joiner says it is for (``psgd join --model/--data/--protocol``; None: not said):
    written into its knock, so the servers refuse a joiner of another run before it takes a
    slot. The data is named by its path, its size and the sha256 of its bytes."""
    said: dict = {}
    if model is not None:
        said["model"] = model
    if protocol is not None:
        said["protocol"] = protocol
    if data is not None:
        if not os.path.isfile(data):
            raise UsageError(f"--data {data}: no such file")
        said["data"] = {"path": os.path.realpath(data), "bytes": os.path.getsize(data),
                        "sha256": _sha256(data)}
    return said


def of_run(settings) -> dict:
    """What a joiner's claims are checked against: the run's model, protocol and data path."""
    return {"model": settings.model, "protocol": settings.protocol, "data": settings.data}


def differs(run: dict, said: dict, digests: dict) -> str:
    """What of a joiner's ``said`` (:func:`claims`) differs from ``run`` (``model``,
    ``protocol``, ``data`` as a path), in one phrase; "" when nothing does. ``digests`` caches
    the run's data digest (computed only when a joiner names the data by another path)."""
    for key in ("model", "protocol"):
        if key in said and said[key] != run[key]:
            return f"its --{key} is {said[key]}, the run's is {run[key]}"
    data = said.get("data")
    if data is None:
        return ""
    path = os.path.realpath(run["data"])
    if data.get("path") == path:
        return ""
    if "run" not in digests:
        digests["run"] = (os.path.getsize(path), _sha256(path))
    if (data.get("bytes"), data.get("sha256")) != digests["run"]:
        return (f"its --data {data.get('path')} is not the run's data {path} (other bytes: "
                f"{data.get('bytes')} against {digests['run'][0]}, or another sha256)")
    return ""


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
