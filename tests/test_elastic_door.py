"""The door's check of what a joiner says it is for (psgd.elastic.door, hello.claims): no MPI."""
import threading

import pytest

from psgd.elastic.door import Door, knock
from psgd.elastic.hello import claims
from psgd.errors import UsageError

RUN = {"model": "mlp:784-64-10", "protocol": "asp"}


def _knock_at(door: Door, said: dict) -> str:
    """Knock with ``said`` while the door looks; the joiner's refusal line, or "" (a turn)."""
    out: list = []

    def joiner():
        try:
            knock(door.port_file, 10, said=said)
            out.append("")
        except UsageError as exc:
            out.append(str(exc))
    thread = threading.Thread(target=joiner)
    thread.start()
    while thread.is_alive():
        ready, _ = door.look()
        if ready is not None:   # the joiner answered its turn
            break
        door.next_look = 0.0
    thread.join(10)
    return out[0]


@pytest.fixture
def files(tmp_path):
    run, copy, other = tmp_path / "run.h5", tmp_path / "copy.h5", tmp_path / "other.h5"
    run.write_bytes(b"the run's data" * 100)
    copy.write_bytes(run.read_bytes())
    other.write_bytes(b"the run's datA" * 100)
    return tmp_path, run, copy, other


@pytest.mark.parametrize("said, refusal", [
    ({}, ""),
    ({"model": "mlp:784-64-10", "protocol": "asp"}, ""),
    ({"model": "mlp:784-32-10"}, "its --model is mlp:784-32-10, the run's is mlp:784-64-10"),
    ({"protocol": "ssp"}, "its --protocol is ssp, the run's is asp"),
    ({"data": "copy"}, ""),              # the same bytes at another path
    ({"data": "other"}, "is not the run's data"),
])
def test_a_joiner_is_refused_before_its_turn_when_what_it_says_differs(files, said, refusal):
    tmp, run, copy, other = files
    door = Door(None, "port", str(tmp / "port"), 5.0, run={**RUN, "data": str(run)})
    if "data" in said:
        said = claims(None, str({"copy": copy, "other": other}[said["data"]]), None)
    line = _knock_at(door, said)
    if not refusal:
        assert line == "" and not door.refused
        return
    assert refusal in line and line.startswith(f"the run at {tmp / 'port'} refused"), line
    assert len(door.refused) == 1 and refusal in door.refused[0]
    assert door.turn is None
    assert sorted(p.name for p in tmp.iterdir()) == ["copy.h5", "other.h5", "run.h5"]


def test_a_door_without_the_run_s_claims_checks_nothing(files):
    tmp, _, _, _ = files
    door = Door(None, "port", str(tmp / "port"), 5.0)
    assert _knock_at(door, {"model": "anything"}) == ""
