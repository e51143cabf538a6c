"""--record / --replay: an asynchronous run replayed bit for bit; --timeline: a valid per-rank trace."""
import json

import h5py
import numpy as np
import pytest

from psgd.errors import PsgdError
from psgd.ps.order import DONE, PUSHED, REPLIED, Recorder, Replay
from psgd.run.checkpoint import list_checkpoints, load_checkpoint
from psgd.run.metrics import read_log

MLP = "mlp:784-32-10"


def train(mpirun, n, data, *flags, check=True):
    return mpirun(n, ["-m", "psgd", "train", "--data", data, "--quiet", "--model", MLP,
                      "--batch-size", 16, *map(str, flags)], timeout=240, check=check)


def outcome(tmp_path, name):
    """Final parameters, every logged loss and the staleness histogram of run ``name``."""
    records = read_log(tmp_path / f"{name}.jsonl")
    final = load_checkpoint(list_checkpoints(tmp_path / name)[-1])
    return (final.params, [r["loss"] for r in records if r["kind"] == "step"],
            records[-1]["staleness_histogram"])


def record_then_replay(mpirun, dataset, tmp_path, ranks, *flags, recorded=(), replayed=()):
    """Record a run (with ``recorded`` flags too), replay it (with ``replayed``), compare."""
    rec = tmp_path / "run.rec.h5"
    for name, mode, extra in (("a", "--record", recorded), ("b", "--replay", replayed)):
        out = train(mpirun, ranks, dataset, *flags, *extra, mode, rec, "--log",
                    tmp_path / f"{name}.jsonl", "--checkpoint-dir", tmp_path / name,
                    "--log-every", 5).stdout
    assert f"psgd: record: {rec}" not in out   # the replay writes no record of its own
    (pa, la, ha), (pb, lb, hb) = outcome(tmp_path, "a"), outcome(tmp_path, "b")
    assert len(ha) > 1, "every push was fresh: nothing asynchronous to replay"
    np.testing.assert_array_equal(pa, pb)
    assert la == lb and ha == hb
    return rec


def test_an_asp_run_with_a_slow_worker_replays_bit_for_bit_without_it(mpirun, dataset, tmp_path):
    """Worker 1 computes 3x slower in the recorded run; the replay runs at full speed and still
    applies every push in the recorded order."""
    rec = record_then_replay(mpirun, dataset, tmp_path, 4, "--protocol", "asp", "--optimizer",
                             "momentum", "--lr", "0.05", "--steps", 40,
                             recorded=("--straggler", "1:slow=3"))
    with h5py.File(rec) as f:
        events = f["shard_0/events"][...]
        assert f.attrs["n_events"].tolist() == [len(events)]
    kinds = events[:, 0].tolist()
    assert kinds.count(PUSHED) == 3 * 40 and kinds.count(DONE) == 3
    assert kinds.count(REPLIED) == 3 * 41     # the first pull and one after every push
    assert events.nbytes / kinds.count(PUSHED) < 40   # bytes per push


@pytest.mark.parametrize("comp", [("dcasgd",), ("amom",), ("dana",),
                                  ("dana-adam", "--optimizer", "adam", "--lr", "0.001"),
                                  # the momentum on the workers, at what each reply names
                                  ("amom", "--compress", "sign", "--momentum-correction", "on")])
def test_ssp_with_staleness_compensation_on_two_shards_replays_bit_for_bit(
        mpirun, dataset, tmp_path, comp):
    record_then_replay(mpirun, dataset, tmp_path, 5, "--protocol", "ssp", "--staleness", 2,
                       "--servers", 2, "--optimizer", "momentum", "--lr", "0.05",
                       "--staleness-comp", *comp, "--steps", 30)


def test_a_replay_of_other_settings_or_a_cut_record_is_refused(mpirun, dataset, tmp_path):
    rec = tmp_path / "r.h5"
    common = ["--protocol", "asp", "--steps", 6]
    train(mpirun, 3, dataset, *common, "--record", rec)
    proc = train(mpirun, 4, dataset, *common, "--seed", 1, "--replay", rec, check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"psgd: error: --replay {rec}: recorded with seed 0, workers 2; this run has seed 1, "
        f"workers 3"]
    with h5py.File(rec, "a") as f:      # a record whose events were cut short
        events = f["shard_0/events"][...]
        del f["shard_0/events"]
        f["shard_0/events"] = events[:-4]
    proc = train(mpirun, 3, dataset, *common, "--replay", rec, check=False)
    assert proc.returncode == 1 and "shard 0's events are cut short" in proc.stderr
    rec.write_bytes(rec.read_bytes()[:1000])   # a truncated file
    proc = train(mpirun, 3, dataset, *common, "--replay", rec, check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"psgd: error: --replay {rec}: not a readable record")
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, message", [
    (["--protocol", "hogwild", "--record", "r.h5"], "--record does not apply to --protocol hogwild"),
    (["--protocol", "allreduce", "--record", "r.h5"], "--record does not apply to --protocol "
                                                      "allreduce"),
    (["--protocol", "asp", "--record", "r.h5", "--replay", "r.h5"], "give --record or --replay"),
    (["--protocol", "asp", "--replay", "none.h5"], "--replay none.h5: no such file"),
])
def test_record_and_replay_bad_input_is_one_line(tmp_path, dataset, flags, message):
    import argparse

    from psgd.run import settings
    (tmp_path / "r.h5").touch()
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    args = parser.parse_args(["--data", dataset, *[str(tmp_path / f) if f.endswith(".h5") and
                                                   f != "none.h5" else f for f in flags]])
    with pytest.raises(ValueError, match=message):
        settings.resolve(args, environ={})


def test_replay_takes_events_in_order_and_names_the_first_that_differs():
    rec = Recorder()
    for kind, worker, clock in [(REPLIED, 0, 0), (REPLIED, 1, 0), (PUSHED, 1, 0), (DONE, 1, -1)]:
        {REPLIED: rec.replied, PUSHED: rec.pushed}.get(kind, lambda w, c: rec.done(w))(worker,
                                                                                      clock)
    events = rec.events()
    assert events.tolist() == [[2, 0, 0], [2, 1, 0], [1, 1, 0], [3, 1, -1]]
    replay = Replay(events, shard=0)
    assert replay.source(n_servers=2) == 2            # worker 0 is rank 2
    assert replay.may_answer(0, 0, within_bound=False) and not replay.may_answer(1, 0, True)
    replay.replied(0, 0)
    assert replay.source(n_servers=2) == 3
    with pytest.raises(PsgdError, match=r"shard 0 got worker 1's push of clock 0 as event 1, "
                                        r"where the record has worker 1's reply to the pull of "
                                        r"clock 0"):
        replay.pushed(1, 0)


def test_timeline_is_a_chrome_trace_whose_spans_tile_each_ranks_time(mpirun, dataset, tmp_path):
    trace_path = tmp_path / "t.json"
    out = train(mpirun, 3, dataset, "--protocol", "ssp", "--steps", 30, "--timeline",
                trace_path).stdout
    assert f"psgd: timeline: {trace_path}" in out
    trace = json.loads(trace_path.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1, 2}
    assert {"apply", "reply"} <= {e["name"] for e in spans if e["pid"] == 0}
    for worker in (1, 2):
        mine = [e for e in spans if e["pid"] == worker]
        assert sum(e["name"] == "compute" for e in mine) == 30
        assert {"push", "pull"} <= {e["name"] for e in mine if e["tid"] == 1}
        loop = sum(e["dur"] for e in mine if e["tid"] == 0) / 1e6
        wall = trace["otherData"]["wall_s"][str(worker)]
        assert loop == pytest.approx(wall, rel=0.03)
        assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in mine)
        pushes = [e for e in mine if e["name"] == "push"]
        assert [e["args"]["clock"] for e in pushes] == list(range(30))
        assert all("staleness" in e["args"] for e in pushes)


def test_plot_draws_a_timeline_and_names_a_file_that_is_not_one(tmp_path):
    from psgd.plot_timeline import plot_timeline
    from psgd.run.trace import trace_events
    packed = np.array([[2, 0, 1.0, 0, 0], [1, 0.0, 0.5, 0, -1], [6, 0.5, 0.6, 0, 1]])
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace_events([np.zeros((1, 5)), packed], n_servers=1)))
    out = plot_timeline(str(path), seconds=1.0)
    assert out == tmp_path / "t.png" and out.read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "x.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"x.json: no traceEvents"):
        plot_timeline(str(tmp_path / "x.json"))
