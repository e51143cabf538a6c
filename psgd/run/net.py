"""`psgd net`: run a command on N emulated nodes behind a rate-limited network.

The command runs in a fresh network namespace whose loopback is shaped with
``tc ... tbf``; MPICH is told to treat every N-th rank as one node
(``MPIR_CVAR_NUM_CLIQUES``) and to go between nodes over TCP. The namespace is
removed when the command ends, fails or is interrupted.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys

from psgd.errors import PsgdError

DESCRIPTION = """\
run COMMAND on N emulated nodes: ranks r and r+N, r+2N, ... share a node (and its
shared memory); between nodes MPICH uses TCP over a loopback limited to RATE.
Needs root, `ip` and `tc` (Debian's iproute2). All nodes share one link of RATE.

  psgd net --nodes 2 --rate 1gbit -- mpiexec -n 4 python -m psgd train --protocol allreduce ...
  psgd net --nodes 2 --rate none -- mpiexec -n 4 python bench/bench_allreduce.py
"""

# what MPICH needs to split ranks into nodes and leave shared memory between them
MPICH_ENV = {"FI_PROVIDER": "tcp", "MPICH_CH4_NETMOD": "ofi"}
_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_RATE = re.compile(r"^(\d+(?:\.\d+)?)([kmgt]?)bit$")
MIN_BURST_BYTES = 256 * 1024   # tbf's bucket: at least this, else 1 ms at the rate


def parse_rate(text: str) -> float | None:
    """Bits per second of a tc rate such as ``1gbit``, ``500mbit``; ``none`` is unshaped (None)."""
    text = text.strip().lower()
    if text == "none":
        return None
    match = _RATE.match(text)
    if not match or float(match.group(1)) <= 0:
        raise PsgdError(f"--rate {text!r} is not a rate; give e.g. 1gbit, 10gbit, 500mbit or none")
    return float(match.group(1)) * _UNITS[match.group(2)]


def burst_bytes(rate_bps: float) -> int:
    """tbf's bucket for ``rate_bps``: 1 ms of traffic, at least ``MIN_BURST_BYTES``."""
    return max(MIN_BURST_BYTES, int(rate_bps / 8 / 1000))


def check_can_make_namespaces() -> None:
    """Raise PsgdError (one line) when this process cannot make a shaped namespace."""
    if os.geteuid() != 0:
        raise PsgdError("psgd net makes a network namespace, which needs root (run it as root, "
                        "or without psgd net on one node)")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise PsgdError(f"psgd net needs {' and '.join(missing)} on PATH; install Debian's "
                        f"iproute2 (apt-get install -y iproute2)")


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no reason given"])[-1]
        raise PsgdError(f"psgd net: `ip {' '.join(args)}` failed: {why}")


class Namespace:
    """A network namespace with its loopback up and shaped; a context manager that removes it."""

    def __init__(self, name: str, rate_bps: float | None) -> None:
        self.name, self.rate_bps = name, rate_bps

    def __enter__(self) -> "Namespace":
        _ip("netns", "add", self.name)
        try:
            _ip("netns", "exec", self.name, "ip", "link", "set", "lo", "up")
            if self.rate_bps is not None:
                _ip("netns", "exec", self.name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
                    "rate", f"{int(self.rate_bps)}bit", "burst", str(burst_bytes(self.rate_bps)),
                    "latency", "50ms")
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def command(self, argv: list[str], nodes: int) -> list[str]:
        rate = "none" if self.rate_bps is None else f"{self.rate_bps:.0f}"
        env = {**MPICH_ENV, "MPIR_CVAR_NUM_CLIQUES": str(nodes), "PSGD_X_NET": f"{rate},{nodes}"}
        return ["ip", "netns", "exec", self.name, "env",
                *(f"{k}={v}" for k, v in env.items()), *argv]


def remove_stale() -> None:
    """Remove the namespaces of ``psgd net`` runs that were killed outright (SIGKILL)."""
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for pid in re.findall(r"^psgd-net-(\d+)\b", listing, re.M):
        if not os.path.exists(f"/proc/{pid}"):
            Namespace(f"psgd-net-{pid}", None).remove()


def run_on_nodes(argv: list[str], nodes: int, rate_bps: float | None) -> int:
    """Run ``argv`` on ``nodes`` emulated nodes; returns its exit status (128 + n for signal n).

    SIGINT, SIGTERM and SIGHUP are passed on to the command (or, before it
    starts, end the set-up); the namespace is removed however the command ends.
    """
    if nodes < 1:
        raise PsgdError(f"--nodes must be >= 1, got {nodes}")
    if not argv:
        raise PsgdError("psgd net needs a command to run after --, e.g. -- mpiexec -n 4 ...")
    check_can_make_namespaces()
    remove_stale()
    procs: list[subprocess.Popen] = []

    def forward(signum, frame):
        if not procs:
            raise PsgdError(f"psgd net: interrupted by signal {signum} while making the namespace")
        try:
            os.killpg(procs[0].pid, signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with Namespace(f"psgd-net-{os.getpid()}", rate_bps) as ns:
            procs.append(subprocess.Popen(ns.command(argv, nodes), start_new_session=True))
            try:
                code = procs[0].wait()
            finally:
                if procs[0].poll() is None:      # an exception in the wait: leave nothing behind
                    os.killpg(procs[0].pid, signal.SIGKILL)
                    procs[0].wait()
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``net`` parser's flags."""
    parser.add_argument("--nodes", type=int, default=2, metavar="N",
                        help="emulated nodes; rank r is on node r mod N (default 2)")
    parser.add_argument("--rate", default="1gbit",
                        help="the link's rate in tc's units (1gbit, 10gbit, 500mbit), or none "
                             "for unshaped TCP (default 1gbit)")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the command to run, e.g. mpiexec -n 4 python -m psgd train ...")


def run(args: argparse.Namespace) -> None:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.exit(run_on_nodes(argv, args.nodes, parse_rate(args.rate)))
