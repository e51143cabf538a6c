"""Staleness compensation on the servers: each method, one module, rewrites a push before its step.

Methods are named here by module path and loaded when a server makes one, so
``psgd train --help`` and validation import none of them.
"""
from __future__ import annotations

import importlib

METHODS = {
    "none": "psgd.ps.compensation.base:Compensation",
    "inverse": "psgd.ps.compensation.inverse:Inverse",
    "dcasgd": "psgd.ps.compensation.dcasgd:DcAsgd",
    "gap": "psgd.ps.compensation.gap:GapAware",
    "amom": "psgd.ps.compensation.amom:AsyncAwareMomentum",
    "dana": "psgd.ps.compensation.dana:Dana",
    "dana-adam": "psgd.ps.compensation.dana_adam:DanaAdam",
}
HELP = {
    "none": "step each push as it comes",
    "inverse": "divide each step by 1 + its staleness",
    "dcasgd": "DC-ASGD-a: add lambda * g*g*(w_now - w_read) / sqrt(meansquare(g))",
    "gap": "Gap-Aware: divide g elementwise by 1 + |w_now - w_read| / (one typical step)",
    "amom": "asynchrony-aware momentum: lower the server's momentum by the implicit "
            "momentum of the measured delay",
    "dana": "DANA: the user's momentum kept per worker, each push stepping lr / W, and pulls "
            "answered with the parameters moved by the expected momentum (the other workers' "
            "and the puller's own)",
    "dana-adam": "DANA's look-ahead for Adam: pulls answered with the parameters moved by "
                 "Adam's expected next steps",
    "auto": "dana for momentum and nesterov (amom under hogwild), dana-adam for adam, none "
            "for sgd",
}
# what `auto` picks, by optimizer (docs/guide/protocols.md; why: docs/design/staleness.md)
AUTO = {"sgd": "none", "momentum": "dana", "nesterov": "dana", "adagrad": "none",
        "adam": "dana-adam"}
# where a protocol cannot run auto's pick (hogwild has no server to answer pulls)
AUTO_FALLBACK = {"dana": "amom", "dana-adam": "none"}
# methods built on one optimizer's state, by the optimizers they need
NEEDS = {"dana": ("momentum", "nesterov"), "dana-adam": ("adam",)}
CHOICES = tuple(METHODS) + ("auto",)
# the methods that set only the learning rate and the momentum, which --momentum-correction
# moves to the workers; dcasgd and gap rewrite each gradient before the momentum sums it
WITH_WORKER_MOMENTUM = ("none", "inverse", "amom")
DEFAULT_LAMBDA = 2.0   # DC-ASGD-a's lambda_0 (Zheng et al. 2017)


def resolve(method: str, optimizer: str, runs: tuple[str, ...] = CHOICES,
            worker_momentum: bool = False) -> str:
    """The method that runs: ``auto`` becomes :data:`AUTO`'s pick for ``optimizer``, or that
    pick's :data:`AUTO_FALLBACK` where the protocol's methods ``runs`` lack it or where the
    workers keep the momentum (``worker_momentum``) and the pick does not compose with that."""
    if method not in CHOICES:
        raise ValueError(f"--staleness-comp {method!r} is not one of {', '.join(CHOICES)}")
    if method != "auto":
        if method in NEEDS and optimizer not in NEEDS[method]:
            raise ValueError(f"--staleness-comp {method} is built on the optimizer's own state: "
                             f"it needs --optimizer {' or '.join(NEEDS[method])}, not {optimizer}")
        return method
    pick = AUTO.get(optimizer, "none")
    if pick not in runs or worker_momentum and pick not in WITH_WORKER_MOMENTUM:
        return AUTO_FALLBACK[pick]
    return pick


def make(method: str, config, optimizer, n: int, n_workers: int = 1):
    """The compensation ``method`` (resolved) for a server's shard of ``n`` parameters."""
    module, _, name = METHODS[method].partition(":")
    return getattr(importlib.import_module(module), name)(config, optimizer, n, n_workers)
