"""The prices `--grid auto` cuts by: `psgd plan`'s :class:`~psgd.plan.cost.Network` (from
--bandwidth, --latency-us, --per-node, or the link ``psgd net`` emulates) and the price
`psgd plan`'s auto-grid rows cut by, :func:`psgd.plan.grid.group_price`."""
from __future__ import annotations

import os
from types import SimpleNamespace

from psgd.errors import UsageError
from psgd.plan.cost import Network
from psgd.plan.grid import group_price
from psgd.plan.inputs import parse_bandwidth

BANDWIDTH, LATENCY_US = "10gbit", 20.0     # psgd plan's defaults
NO_NETWORK_FLAGS = SimpleNamespace(bandwidth=None, latency_us=None, per_node=None, mac_ns=None)


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
    """(``price(kind, nbytes)`` of :func:`~psgd.plan.grid.group_price` for a group of ``parts``
    on a grid of ``ranks`` from world rank ``first``, on the network of ``flags``; the
    network's line)."""
    net, cliques, line = network(flags, environ)
    mac_ns = getattr(flags, "mac_ns", None)
    return group_price(net, flags.per_node or 1, cliques, ranks, parts, first,
                       **({"mac_s": mac_ns * 1e-9} if mac_ns else {})), line
