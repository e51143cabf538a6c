"""The protocol registry: what each entry says, that validation and help read it, and that a
new protocol is one entry."""
import argparse
import dataclasses
import math

import pytest

from psgd import protocols
from psgd.protocols import PROTOCOLS, Protocol, get
from psgd.protocols.features import make_config
from psgd.protocols.features import CompressionOptions


def test_every_entry_names_halves_that_import():
    for p in PROTOCOLS.values():
        assert callable(protocols.load(p.worker)), p.name
        assert (p.server is not None) == p.servers, p.name
        if p.server:
            assert callable(protocols.load(p.server)), p.name
        if p.update_rule:
            assert isinstance(protocols.load(p.update_rule), type), p.name


@pytest.mark.parametrize("name, given, bound", [
    ("bsp", None, 0.0), ("ssp", None, 2.0), ("ssp", 0, 0.0), ("ssp", 5, 5.0),
    ("asp", None, math.inf), ("hogwild", None, math.inf), ("allreduce", None, 0.0)])
def test_the_bound_in_force(name, given, bound):
    config = make_config(name, 10, staleness=given)
    assert config.staleness == bound
    assert get(name).check(staleness=given) == bound


def test_a_fixed_bound_refuses_staleness_and_a_negative_one_is_refused():
    for name in ("bsp", "asp", "hogwild", "allreduce"):
        with pytest.raises(ValueError, match=f"--staleness applies to --protocol ssp only, "
                                             f"not {name}"):
            get(name).check(staleness=1)
    with pytest.raises(ValueError, match="--staleness must be >= 0, got -1"):
        get("ssp").check(staleness=-1)


def test_update_rules_go_to_the_parameter_server_protocols_only():
    from psgd.ps.bsp import BspUpdate
    from psgd.ps.ssp import SspUpdate
    assert make_config("bsp", 4).update_rule is BspUpdate
    assert make_config("ssp", 4).update_rule is SspUpdate
    assert make_config("asp", 4).update_rule is SspUpdate
    assert make_config("hogwild", 4).update_rule is None
    assert make_config("allreduce", 4).update_rule is None


def test_servers_and_optimizers_are_checked_against_the_entry():
    with pytest.raises(ValueError, match="--protocol allreduce has no servers: use --servers 0"):
        get("allreduce").check(n_servers=1)
    for name in ("bsp", "ssp", "asp", "hogwild"):
        with pytest.raises(ValueError, match=f"--protocol {name} needs at least one server"):
            get(name).check(n_servers=0)
    with pytest.raises(ValueError, match="--optimizer 'rmsprop' is not one of"):
        get("asp").check(optimizer="rmsprop")
    get("asp").check(optimizer="adam")


def test_labels_name_the_bound_only_where_the_user_sets_it():
    assert get("ssp").label(3.0) == "ssp (s=3)"
    assert get("bsp").label(0.0) == "bsp"
    assert get("asp").label(math.inf) == "asp"


def test_unknown_protocol_names_the_choices():
    with pytest.raises(ValueError, match="--protocol 'gosip' is not one of bsp, ssp, asp, "
                                         "hogwild, allreduce, gossip, adpsgd"):
        get("gosip")


def test_a_new_protocol_is_one_entry(monkeypatch, tmp_path):
    """An entry added to the registry is accepted by psgd train's validation, shown in its help,
    and its own rules (here: no servers, sgd only) are enforced, with no other change."""
    entry = Protocol("lockstep", servers=False,
                     worker="psgd.collectives.allreduce_worker:AllreduceWorker",
                     optimizers=("sgd",), reasons={"optimizer": "a test protocol"},
                     summary="a test protocol: allreduce under another name")
    monkeypatch.setitem(PROTOCOLS, "lockstep", entry)
    from psgd.run import settings
    data = tmp_path / "d.h5"
    data.write_bytes(b"")

    def resolve(*flags):
        parser = argparse.ArgumentParser()
        settings.add_arguments(parser)
        return settings.resolve(parser.parse_args(["--data", str(data), *flags]), environ={})

    s = resolve("--protocol", "lockstep")
    assert s.servers == 0 and s.staleness is None
    with pytest.raises(ValueError, match="optimizer 'momentum' is not supported with --protocol "
                                         "lockstep: a test protocol"):
        resolve("--protocol", "lockstep", "--optimizer", "momentum")
    with pytest.raises(ValueError, match="lockstep has no servers"):
        resolve("--protocol", "lockstep", "--servers", "1")
    assert "lockstep" in settings._protocol_help()


def test_abilities_are_one_set_of_known_names_that_validation_reads():
    from psgd.protocols import ABILITIES, names
    for entry in PROTOCOLS.values():
        assert entry.abilities <= set(ABILITIES), entry.name
    with pytest.raises(ValueError, match=r"unknown abilities \['overlapp'\]"):
        Protocol("typo", servers=False, worker="x:Y", summary="", abilities=frozenset({"overlapp"}))
    with pytest.raises(KeyError, match="'compres' is not one of"):
        get("bsp").can("compres")
    assert names(able="overlap") == "ssp or asp"
    assert names(able="compress", servers=True) == "bsp or ssp or asp"
    # an entry that gains an ability is accepted where it was refused, with no other change
    plain = Protocol("plain", servers=False, worker="psgd.collectives.allreduce_worker:AllreduceWorker",
                     summary="")
    topk = CompressionOptions(compress="topk:0.1")
    with pytest.raises(ValueError, match="--compress topk:0.1 applies to --protocol"):
        topk.check(plain)
    topk.check(dataclasses.replace(plain, abilities=plain.abilities | {"compress"}))


def _refuse(key: str, p):
    """Ask protocol ``p`` for what its entry refuses under ``key`` (an ability or a limit)."""
    from psgd.nn.optim import OPTIMIZERS
    from psgd.pipeline.schedules import SCHEDULES
    from psgd.ps import compensation
    from psgd.protocols.features import RecordOptions
    from psgd.run.mode_flags import ElasticOptions
    return {
        "optimizer": lambda: p.check(optimizer=next(o for o in OPTIMIZERS
                                                   if o not in p.optimizers)),
        "staleness-comp": lambda: p.compensation(next(
            m for m in compensation.choices() if m not in p.compensation_choices()), "momentum"),
        "replay": lambda: RecordOptions(record="r.h5").resolved(None, p),
        "compress": lambda: CompressionOptions(compress="topk:0.01").check(p),
        "error-feedback": lambda: CompressionOptions(compress=p.feedback_refused[0],
                                                     error_feedback="on").check(p),
        "pipeline": lambda: p.check_pipeline(next(s for s in SCHEDULES if s not in p.pipelines)),
        "elastic": lambda: ElasticOptions(elastic=True, port_file="p").resolved(None, p),
    }[key]()


def test_every_refusal_line_ends_with_the_reason_its_entry_declares():
    """Each declared reason (and each default reason that applies) is what the refusal says."""
    from psgd.elastic import merged
    from psgd.protocols import DEFAULT_REASONS, LIMITS
    asked = set()
    for p in PROTOCOLS.values():
        keys = set(p.reasons) | {k for k in DEFAULT_REASONS if k not in LIMITS and not p.can(k)}
        if merged(p):   # merged jobs instead
            keys.discard("elastic")
        if p.compensations is not None:
            keys.add("staleness-comp")
        for key in sorted(keys):
            with pytest.raises(ValueError) as err:
                _refuse(key, p)
            reason = p.why_not(key)
            assert reason and reason in str(err.value), (p.name, key, str(err.value))
            asked.add(key)
    assert asked == {"optimizer", "staleness-comp", "replay", "compress", "error-feedback",
                     "pipeline", "elastic"}


def test_a_reason_for_an_ability_the_entry_has_is_refused():
    with pytest.raises(ValueError, match=r"reasons for \['compress'\]"):
        Protocol("odd", servers=False, worker="x:Y", summary="",
                 abilities=frozenset({"compress"}), reasons={"compress": "never"})
    assert Protocol("own", servers=False, worker="x:Y", summary="",
                    reasons={"replay": "its own"}).why_not("replay") == ": its own"
