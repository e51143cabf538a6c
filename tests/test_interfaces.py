"""Every registry entry's halves have the shapes of psgd.protocols.interfaces: the methods the
run loop and the servers call, with parameters they can be called with."""
import inspect

import pytest

from psgd import protocols
from psgd.halves import WorkerHalf as WorkerHalfBase
from psgd.protocols import PROTOCOLS, interfaces
from psgd.ps.update import UpdateRuleBase


def methods(protocol_class) -> dict:
    """The methods an interface declares (its own and its bases', not typing's)."""
    found = {}
    for klass in reversed(protocol_class.__mro__):
        if klass.__module__ == interfaces.__name__:
            found.update({k: v for k, v in vars(klass).items()
                          if inspect.isfunction(v) and not k.startswith("_")})
    return found


def missing(cls, interface) -> list:
    """The methods of ``interface`` that ``cls`` lacks, or whose parameters (by name, in order)
    a call as the interface writes it could not bind."""
    wrong = []
    for name, declared in methods(interface).items():
        impl = getattr(cls, name, None)
        if not callable(impl):
            wrong.append(name)
            continue
        want = list(inspect.signature(declared).parameters)[1:]
        have = inspect.signature(impl).parameters
        names = list(have)[1:len(want) + 1]
        extra = [p for p in list(have.values())[len(want) + 1:]
                 if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if names != want or extra:
            wrong.append(f"{name}{inspect.signature(impl)}")
    return wrong


def test_the_checker_finds_a_missing_method_and_a_wrong_signature():
    class Half(WorkerHalfBase):
        def start(self, params, clock=0): ...
        def step(self, params, g, clock, lr): ...
    assert sorted(missing(Half, interfaces.WorkerHalf)) == ["finish", "step(self, params, g, clock, lr)"]


@pytest.mark.parametrize("name", list(PROTOCOLS))
def test_every_entry_s_worker_half_meets_the_interface(name):
    entry = PROTOCOLS[name]
    worker = protocols.load(entry.worker)
    assert issubclass(worker, WorkerHalfBase), f"{name}: its worker half is no psgd.halves.WorkerHalf"
    assert missing(worker, interfaces.WorkerHalf) == [], name
    if worker.runs_steps is not WorkerHalfBase.runs_steps:
        assert missing(worker, interfaces.StepRunner) == [], name
    if entry.decentralized:
        assert missing(worker, interfaces.DecentralizedWorker) == [], name


@pytest.mark.parametrize("name", [n for n, p in PROTOCOLS.items() if p.servers])
def test_every_server_half_and_update_rule_meets_the_interface(name):
    entry = PROTOCOLS[name]
    serve = inspect.signature(protocols.load(entry.server))
    declared = inspect.signature(interfaces.ServerHalf.__call__).parameters
    assert list(serve.parameters)[:len(declared) - 1] == list(declared)[1:], name
    if entry.update_rule:
        rule = protocols.load(entry.update_rule)
        assert issubclass(rule, UpdateRuleBase), name
        assert missing(rule, interfaces.UpdateRule) == [], name
