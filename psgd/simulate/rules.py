"""A protocol's rules for the event loop, asked of the registry, with costs from `psgd plan`'s model."""
from __future__ import annotations

from psgd.plan.cost import STEP_PASSES, Job, Network
from psgd.protocols import Protocol, names
from psgd.simulate.events import Rules


def rules_for(protocol: Protocol, staleness, job: Job, net: Network) -> Rules:
    """The event rules of ``protocol`` (``staleness``: ``--staleness`` as given) on ``job``.

    A server's work per push and per step is the cost model's (passes over its
    B/S at the shared-memory bandwidth, plus decoding a coded push): a
    protocol whose bound is fixed at 0 adds each push and steps once per
    clock (bsp), the others step on each push; a lock-free one (staleness
    counted in updates: hogwild) has no server loop.

    Raises
    ------
    ValueError
        One line: a protocol the simulator does not model, or a bad ``staleness``.
    """
    if not protocol.servers:
        raise ValueError(f"psgd simulate models the parameter-server protocols "
                         f"({names(servers=True)}) and the decentralized ones, not "
                         f"{protocol.name}")
    if staleness == "auto":
        raise ValueError("psgd simulate needs a fixed bound: give --staleness N, not auto")
    bound = protocol.staleness_bound(staleness)
    share = job.nbytes / job.servers
    shm = net.shm_bandwidth
    decode_s = job.compression.decode_s * share
    summed = protocol.bound == 0.0
    lockfree = protocol.staleness_unit == "updates"
    return Rules(bound=bound, summed=summed, lockfree=lockfree,
                 push_s=0.0 if lockfree else share / shm + decode_s + (
                     0.0 if summed else STEP_PASSES * share / shm),
                 advance_s=STEP_PASSES * share / shm if summed else 0.0,
                 push_bytes=(job.update_bytes if lockfree else job.coded_bytes) / job.servers,
                 pull_bytes=(job.update_bytes if lockfree else job.nbytes) / job.servers)
