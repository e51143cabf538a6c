"""Staleness compensation on the servers: each method, one module, rewrites a push before its step.

Each method is one :class:`Method` entry: the class it loads, its help, the optimizers it is
built on, whether it composes with worker-side momentum and which optimizers ``auto`` gives it.
Classes load when a server makes one, so ``psgd train --help`` and validation import none of
them. A method from outside psgd is one module that calls :func:`register`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from psgd.errors import UsageError

AUTO = "auto"
AUTO_HELP = "dana for momentum and nesterov (amom under hogwild), dana-adam for adam, none for sgd"
DEFAULT_LAMBDA = 2.0   # DC-ASGD-a's lambda_0 (Zheng et al. 2017)


@dataclass(frozen=True)
class Method:
    """One compensation method, as validation and ``auto`` see it.

    Attributes
    ----------
    name : str
        ``--staleness-comp NAME``.
    target : str
        ``"module:Class"``, a :class:`psgd.ps.compensation.base.Compensation`.
    help : str
        One line for ``--help``.
    needs : tuple of str
        The optimizers it is built on (empty: any).
    with_worker_momentum : bool
        It sets only the learning rate and the momentum, so it composes with
        ``--momentum-correction`` moving the momentum to the workers (a method that rewrites
        each gradient before the momentum sums it does not).
    auto_for : tuple of str
        The optimizers for which ``auto`` picks it.
    fallback : str or None
        What ``auto`` picks instead where a protocol cannot run it, or where the workers keep
        the momentum and it does not compose with that.
    """

    name: str
    target: str
    help: str
    needs: tuple[str, ...] = ()
    with_worker_momentum: bool = False
    auto_for: tuple[str, ...] = ()
    fallback: str | None = None


METHODS: dict[str, Method] = {}


def register(method: Method) -> None:
    """Add ``method``; a UsageError if its name is taken or is ``auto``, or an optimizer
    ``auto`` would give it already has a method."""
    if method.name in METHODS or method.name == AUTO:
        raise UsageError(f"--staleness-comp {method.name!r} is registered already")
    for optimizer in method.auto_for:
        if auto_pick(optimizer) != "none":
            raise UsageError(f"--staleness-comp {method.name}: auto already picks "
                             f"{auto_pick(optimizer)} for --optimizer {optimizer}")
    METHODS[method.name] = method


def choices() -> tuple[str, ...]:
    """Every ``--staleness-comp`` value: the registered methods and ``auto``."""
    return (*METHODS, AUTO)


def help_items() -> dict[str, str]:
    """Each choice's help line, ``auto`` last."""
    return {**{m.name: m.help for m in METHODS.values()}, AUTO: AUTO_HELP}


def with_worker_momentum() -> tuple[str, ...]:
    """The methods that compose with the workers keeping the momentum."""
    return tuple(m.name for m in METHODS.values() if m.with_worker_momentum)


def auto_pick(optimizer: str) -> str:
    """What ``auto`` picks for ``optimizer`` where nothing stops it (``none`` if no method
    claims the optimizer)."""
    return next((m.name for m in METHODS.values() if optimizer in m.auto_for), "none")


def resolve(method: str, optimizer: str, runs: tuple[str, ...] | None = None,
            worker_momentum: bool = False) -> str:
    """The method that runs: ``auto`` becomes :func:`auto_pick`'s method for ``optimizer``, or
    that method's fallback where the protocol's methods ``runs`` (None: all) lack it or where
    the workers keep the momentum (``worker_momentum``) and the pick does not compose with it."""
    if method not in choices():
        raise UsageError(f"--staleness-comp {method!r} is not one of {', '.join(choices())}")
    if method != AUTO:
        needs = METHODS[method].needs
        if needs and optimizer not in needs:
            raise UsageError(f"--staleness-comp {method} is built on the optimizer's own "
                             f"state: it needs --optimizer {' or '.join(needs)}, not {optimizer}")
        return method
    pick = METHODS[auto_pick(optimizer)]
    runs = choices() if runs is None else runs
    if pick.name not in runs or worker_momentum and not pick.with_worker_momentum:
        return pick.fallback or "none"
    return pick.name


def make(method: str, config, optimizer, n: int, n_workers: int = 1):
    """The compensation ``method`` (resolved) for a server's shard of ``n`` parameters."""
    module, _, name = METHODS[method].target.partition(":")
    return getattr(importlib.import_module(module), name)(config, optimizer, n, n_workers)


_PACKAGE = "psgd.ps.compensation"
for _method in (
        Method("none", f"{_PACKAGE}.base:Compensation", "step each push as it comes",
               with_worker_momentum=True),
        Method("inverse", f"{_PACKAGE}.inverse:Inverse",
               "divide each step by 1 + its staleness", with_worker_momentum=True),
        Method("dcasgd", f"{_PACKAGE}.dcasgd:DcAsgd",
               "DC-ASGD-a: add lambda * g*g*(w_now - w_read) / sqrt(meansquare(g))"),
        Method("gap", f"{_PACKAGE}.gap:GapAware",
               "Gap-Aware: divide g elementwise by 1 + |w_now - w_read| / (one typical step)"),
        Method("amom", f"{_PACKAGE}.amom:AsyncAwareMomentum",
               "asynchrony-aware momentum: lower the server's momentum by the implicit "
               "momentum of the measured delay", with_worker_momentum=True),
        Method("dana", f"{_PACKAGE}.dana:Dana",
               "DANA: the user's momentum kept per worker, each push stepping lr / W, and pulls "
               "answered with the parameters moved by the expected momentum (the other "
               "workers' and the puller's own)",
               needs=("momentum", "nesterov"), auto_for=("momentum", "nesterov"),
               fallback="amom"),
        Method("dana-adam", f"{_PACKAGE}.dana_adam:DanaAdam",
               "DANA's look-ahead for Adam: pulls answered with the parameters moved by Adam's "
               "expected next steps", needs=("adam",), auto_for=("adam",), fallback="none")):
    register(_method)
