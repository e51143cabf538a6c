"""The prices `--grid auto` cuts by: `psgd plan`'s :class:`~psgd.plan.cost.Network` (from
--bandwidth, --latency-us, --per-node, or the link ``psgd net`` emulates) and its all-reduce
by messages, :func:`~psgd.plan.cost.flat_allreduce_s`, with an all-gather priced as an
all-reduce of half its bytes, as `psgd plan`'s tensor rows price it."""
from __future__ import annotations

import os
from dataclasses import replace
from types import SimpleNamespace

from psgd.errors import UsageError
from psgd.plan.cost import Job, Network, flat_allreduce_s
from psgd.plan.inputs import parse_bandwidth

BANDWIDTH, LATENCY_US = "10gbit", 20.0     # psgd plan's defaults
NO_NETWORK_FLAGS = SimpleNamespace(bandwidth=None, latency_us=None, per_node=None)


def emulated(environ=os.environ) -> tuple[float | None, int] | None:
    """(bytes/s or None when unshaped, nodes) of the ``psgd net`` link this run is under
    (``PSGD_X_NET``: bits/s or none, then the nodes), None outside one."""
    raw = environ.get("PSGD_X_NET")
    if not raw:
        return None
    try:
        rate, nodes = raw.split(",")
        return (None if rate == "none" else float(rate) / 8), int(nodes)
    except ValueError:
        raise UsageError(f"environment variable PSGD_X_NET={raw!r}: expected RATE,NODES") from None


def network(flags, environ=os.environ) -> tuple[Network, int | None, str]:
    """(the network, psgd net's nodes or None, a line naming both) for ``flags`` (bandwidth,
    latency_us, per_node; None where not given): a flag wins, then psgd net's link (one link
    all nodes share), then psgd plan's default."""
    net = emulated(environ)
    rate = net[0] if net else None
    bandwidth = parse_bandwidth(flags.bandwidth) if flags.bandwidth else rate or parse_bandwidth(BANDWIDTH)
    latency = flags.latency_us if flags.latency_us is not None else LATENCY_US
    shared = net is not None
    where = f"psgd net's {net[1]} nodes, one shared link" if shared \
        else f"{flags.per_node or 1} rank(s) per node"
    line = f"{bandwidth * 8e-9:g} Gbit/s, {latency:g} us per message, {where}"
    return Network(bandwidth, latency * 1e-6, shared), (net[1] if net else None), line


def pricer(flags, ranks: int, parts: int, first: int = 0, environ=os.environ):
    """``price(kind, nbytes)``: seconds of one collective of ``nbytes`` among the ``parts``
    ranks of a group (kind ``all-reduce`` or ``all-gather``), or across the replicas (kind
    ``replica all-reduce``), on a grid of ``ranks`` from world rank ``first`` in which rank w
    is part w % parts of replica w // parts; and the network's line."""
    net, cliques, line = network(flags, environ)
    job = Job(1, 0.0, 1, first + ranks, 0, flags.per_node or 1, cliques)
    group = [first + r for r in range(parts)]
    replicas = [first + r for r in range(0, ranks, parts)]

    def price(kind: str, nbytes: float) -> float:
        ranks_of = replicas if kind == "replica all-reduce" else group
        reduced = nbytes / 2 if kind == "all-gather" else nbytes
        return flat_allreduce_s(replace(job, n_params=max(1, int(reduced // 4))), ranks_of, net)
    return price, line

