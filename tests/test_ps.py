"""Parameter server (bsp/ssp/asp) under mpiexec: exactness, staleness bounds, bad pushes, idle CPU."""
import json
import time

import numpy as np
import pytest
from conftest import run_mpi

from psgd.mpi.roles import Roles
from psgd.mpi.shardmap import ShardMap
from psgd.protocols.features import make_config


def result_of(proc):
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no RESULT line\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return json.loads(lines[-1][len("RESULT "):])


BSP_CASES = [(1, 1, "window"), (1, 2, "window"), (2, 1, "window"), (3, 1, "window"),
             (3, 2, "window"), (1, 3, "window"), (1, 2, "messages"), (3, 2, "messages"),
             (1, 3, "messages"), (2, 2, "two-nodes"), (3, 2, "two-nodes")]


def _bsp(servers, workers, transport):
    return servers + workers, (["bsp", "--servers", servers, "--steps", 50]
                               + (["--messages"] if transport == "messages" else []))


def _stale(n, servers, protocol, staleness=0, sleep=0.03, steps=15, overlap=False):
    return n, (["stale", "--servers", servers, "--protocol", protocol, "--staleness", staleness,
                "--sleep", sleep, "--steps", steps] + (["--overlap"] if overlap else []))


# ps_check.py scenarios by name: (ranks, argv). The scenarios of one world size share one
# launch (``--then``), made when a test first asks for one of them.
SCENARIOS = {
    **{("bsp", s, w, t): _bsp(s, w, t) for s, w, t in BSP_CASES if t != "two-nodes"},
    **{("buffers-bsp", w): (2 + w, ["bsp", "--servers", 2, "--steps", 5, "--optimizer",
                                    "momentum"]) for w in (1, 3)},
    **{("buffers-ssp", w): _stale(2 + w, 2, "ssp", 1, sleep=0.0, steps=5) for w in (1, 3)},
    "snapshots": (4, ["bsp", "--servers", 2, "--steps", 30, "--optimizer", "momentum",
                      "--snapshot-every", 7]),
    "resumed": (4, ["bsp", "--servers", 3, "--steps", 20, "--start-clock", 100,
                    "--optimizer", "momentum", "--snapshot-every", 7]),
    "ssp-1": _stale(3, 1, "ssp", 1),
    "ssp-3": _stale(5, 2, "ssp", 3, sleep=0.05),
    "asp": _stale(5, 2, "asp", sleep=0.05),
    "ssp-0": _stale(3, 1, "ssp", 0),
    **{("overlap-one-worker", s): (s + 1, ["overlap", "--servers", s, "--steps", 30, "--overlap"])
       for s in (1, 2)},
    **{("overlap-ssp", s): _stale(5, 2, "ssp", s, sleep=0.05, overlap=True) for s in (1, 3)},
    "cpu": (3, ["cpu", "--servers", 1, "--steps", 10, "--sleep", 0.2]),
}


@pytest.fixture(scope="module")
def scenario():
    """The RESULT of a scenario of SCENARIOS, by name (its world size's launch made on first use)."""
    launched = {}

    def result(key):
        n = SCENARIOS[key][0]
        if n not in launched:
            keys = [k for k, (ranks, _) in SCENARIOS.items() if ranks == n]
            argv = ["ps_check.py"]
            for i, k in enumerate(keys):
                argv += (["--then"] if i else []) + SCENARIOS[k][1]
            proc = run_mpi(n, argv, timeout=60 + 30 * len(keys), check=False)
            results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines()
                       if line.startswith("RESULT ")]
            launched[n] = proc, dict(zip(keys, results))     # in order, up to a failure
        proc, results = launched[n]
        assert key in results, (f"scenario {key} of the {n}-rank launch gave no RESULT: exit "
                                f"{proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n"
                                f"{proc.stderr[-4000:]}")
        return results[key]
    return result


@pytest.mark.parametrize("servers,workers,transport", BSP_CASES)
def test_bsp_sgd_equals_serial_sgd_on_concatenated_batches(mpirun, scenario, servers, workers,
                                                           transport):
    # two-nodes: MPICH splits the ranks into two cliques it treats as nodes (ranks 0, 2, 4
    # and 1, 3), so each worker pushes to some servers through the window, to others by
    # messages, and a bsp server sums lent and received pushes of the same clock
    if transport == "two-nodes":
        res = result_of(mpirun(servers + workers, ["ps_check.py", *_bsp(servers, workers, "")[1]],
                               timeout=60, env={"MPIR_CVAR_NUM_CLIQUES": "2"}))
    else:
        res = scenario(("bsp", servers, workers, transport))
    assert res["n_updates"] == 50
    assert res["max_err"] < 1e-5
    # bsp's workers take their replies before they push again: every step is in place
    assert res["in_place"] == 50 and res["version_waits"] == 0, res
    # every push went the way asked: read in place from the window, or received
    ranks = range(servers, servers + workers)
    window = {"window": [50 * workers] * servers, "messages": [0] * servers,
              "two-nodes": [50 * sum(w % 2 == s % 2 for w in ranks) for s in range(servers)]}
    assert res["window_pushes"] == [[n, 50 * workers] for n in window[transport]], res


def test_server_buffers_are_the_same_with_one_or_three_workers(scenario):
    shard = [26, 26]  # ShardMap(52, 2)
    for workers in (1, 3):
        bsp = scenario(("buffers-bsp", workers))
        assert bsp["buffer_bytes"] == [4 * n * (5 + 1) for n in shard]  # 3 versions, 2 sums, k=1
        ssp = scenario(("buffers-ssp", workers))
        assert ssp["buffer_bytes"] == [4 * n * 4 for n in shard]  # 3 versions + receive, sgd


def test_bsp_momentum_snapshots_equal_serial_state_after_each_clock(scenario):
    assert scenario("snapshots")["snapshots"] == [6, 13, 20, 27]


def test_bsp_resumed_at_clock_100_snapshots_the_resumed_clocks(scenario):
    assert scenario("resumed")["snapshots"] == [104, 111, 118]


def test_ssp_staleness_reaches_bound_one_and_never_exceeds_it(scenario):
    assert scenario("ssp-1")["server_max"] == [1]


def test_ssp_bound_three_is_tight_on_every_server_and_asp_is_staler(scenario):
    assert scenario("ssp-3")["server_max"] == [3, 3]
    assert min(scenario("asp")["server_max"]) > 3


def test_ssp_zero_is_a_barrier_per_clock(scenario):
    assert scenario("ssp-0")["server_max"] == [0]


@pytest.mark.parametrize("servers", [1, 2])
def test_overlap_with_one_worker_is_sgd_delayed_by_exactly_one_clock(scenario, servers):
    res = scenario(("overlap-one-worker", servers))
    assert res["hists"] == [[1, 29]] * servers


def test_overlap_keeps_the_ssp_bound_tight_on_every_server(scenario):
    for s in (1, 3):
        res = scenario(("overlap-ssp", s))
        assert res["server_max"] == [s, s], (s, res)
        assert all(h[0] <= 3 for h in res["hists"]), res  # only first pushes read fresh params


def test_overlap_is_rejected_where_the_next_params_need_the_own_push():
    from psgd.config import ProtocolConfig
    for name, staleness in (("bsp", None), ("ssp", 0), ("hogwild", None), ("allreduce", None)):
        with pytest.raises(ValueError, match="--overlap needs --protocol ssp or asp with a "
                                             "staleness bound >= 1"):
            make_config(name, 10, staleness=staleness, overlap=True)
    assert make_config("ssp", 10, staleness=1, overlap=True).overlap
    assert make_config("asp", 10, overlap=True).overlap
    with pytest.raises(ValueError, match="overlap needs a staleness bound >= 1"):
        ProtocolConfig("bsp", 10, overlap=True)


@pytest.mark.parametrize("flags", [["--protocol", "bsp"], ["--protocol", "ssp", "--staleness", "0"],
                                   ["--protocol", "allreduce", "--servers", "0"]])
def test_train_overlap_flag_is_rejected_outside_asp_and_ssp_with_slack(dataset, flags):
    import argparse

    from psgd.run.settings import add_arguments, resolve
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--data", dataset, "--overlap", *flags])
    with pytest.raises(ValueError, match="--overlap needs --protocol ssp or asp"):
        resolve(args, environ={})


@pytest.mark.parametrize("protocol", [["asp"], ["ssp", "--staleness", "1"]])
def test_lenet_trains_with_overlap_and_records_honest_staleness(mpirun, dataset, tmp_path,
                                                                  protocol):
    from psgd.run.metrics import read_log
    log = tmp_path / "run.jsonl"
    mpirun(3, ["-m", "psgd", "train", "--data", dataset, "--model", "lenet", "--quiet",
               "--protocol", *protocol, "--overlap", "--lr", "0.1", "--batch-size", 32,
               "--steps", 200, "--log", log], timeout=180)
    records = read_log(log)
    assert records[0]["overlap"] is True
    summary = records[-1]
    assert summary["kind"] == "summary"
    assert summary["test_accuracy"] > 0.3, summary  # chance is 0.1; measured 0.57-0.67 (ssp)
    assert summary["window_pushes"] == 0, summary   # overlap pushes by messages
    hist = summary["staleness_histogram"]
    assert sum(hist) == 2 * 200 and hist[0] <= 2, hist  # only each worker's first push is fresh
    if protocol[0] == "ssp":
        assert len(hist) == 2, hist                      # never above the bound s = 1


@pytest.mark.parametrize("bad,servers,protocol,words", [
    ("length", 1, "asp", "has wrong length"),
    ("shard", 2, "asp", "names shard 0, but it reached server rank 1"),
    ("nonfinite", 1, "asp", "non-finite"),
    # bsp checks a push when a pass reads it or the server is idle: here the other worker
    # never pushes, so only the idle check can catch it
    ("nonfinite", 1, "bsp", "non-finite"),
    ("window-empty", 1, "asp", "its segment holds 0 float32, not the 52 of the parameter vector"),
    ("window-shard", 2, "bsp", "names shard 0, but it reached server rank 1"),
])
def test_bad_push_aborts_the_job_naming_sender_and_problem(mpirun, bad, servers, protocol,
                                                           words):
    t0 = time.monotonic()
    proc = mpirun(servers + 2, ["ps_check.py", "bad", "--bad", bad, "--servers", servers,
                                "--protocol", protocol], timeout=40, check=False)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 30
    assert words in proc.stderr and f"from rank {servers}" in proc.stderr, proc.stderr


def test_no_room_for_the_push_window_ends_the_job_with_one_clear_error(mpirun):
    t0 = time.monotonic()
    proc = mpirun(3, ["ps_check.py", "no-room"], timeout=40, check=False)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 30
    assert "shared-memory push window (unable to allocate shared memory)" in proc.stderr, \
        proc.stderr
    assert "PSGD_X_PS_PUSH_WINDOW=0" in proc.stderr and "Traceback" not in proc.stderr


def test_server_uses_little_cpu_while_workers_compute(scenario):
    (server,) = scenario("cpu")
    assert server["wall_s"] >= 2.0
    assert server["fraction"] < 0.2, server


@pytest.mark.parametrize("protocol", ["bsp", "ssp", "asp"])
def test_ps_protocol_without_servers_is_rejected(protocol):
    from psgd.protocols import get
    from psgd.ps.server import serve
    from psgd.ps.worker import PSWorker
    with pytest.raises(ValueError, match=f"--protocol {protocol} needs at least one server"):
        get(protocol).check(n_servers=0)
    roles = Roles(comm=None, rank=0, size=2, n_servers=0, n_workers=2, worker_comm=None)
    config = make_config(protocol, 10)
    with pytest.raises(ValueError, match="shard map has 1 shards but the job has 0 servers"):
        PSWorker(roles, ShardMap(10, 1), config)
    with pytest.raises(ValueError, match="shard map has 1 shards but the job has 0 servers"):
        serve(roles, ShardMap(10, 1), config)


def test_shard_state_packs_header_params_and_state_rows_and_unpacks():
    from psgd.ps.messages import pack_shard_state, unpack_shard_state
    p = np.arange(5, dtype=np.float32)
    m, v = p * 2, p * 3
    clock, shard, rows = unpack_shard_state(pack_shard_state(7, 2, p, [m, v]))
    assert (clock, shard) == (7, 2)
    np.testing.assert_array_equal(rows, np.stack([p, m, v]))


def _optimizer_case(name: str, seed: int, n: int = 1001):
    """Initial float32 parameters, three gradients and two fresh optimizers ``name`` of length n."""
    from psgd.nn.optim import make_optimizer
    rng = np.random.default_rng(seed)
    src = rng.standard_normal(n).astype(np.float32)
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    return src, grads, [make_optimizer(name, n, weight_decay=0.01) for _ in range(2)]


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov", "adam"])
@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_step_into_equals_in_place_step_on_a_copy_and_leaves_the_source(name, scale):
    from psgd.ps.versions import step_into
    src, grads, (ref, fused) = _optimizer_case(name, seed=3)
    want, have = src.copy(), src.copy()
    for g in grads:
        ref.step(want, g * np.float32(scale), 0.05)
        dst = np.empty_like(have)
        keep = have.copy()
        assert step_into(fused, have, g, dst, 0.05, scale)
        fused.steps += 1
        np.testing.assert_array_equal(have, keep)
        have = dst
    np.testing.assert_array_equal(have, want)
    for key in ref.state_keys:
        np.testing.assert_array_equal(getattr(fused, key), getattr(ref, key))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_step_into_reports_a_nonfinite_gradient_and_sgd_source_is_untouched(bad):
    from psgd.nn.optim import make_optimizer
    from psgd.ps.versions import step_into
    src = np.ones(100, np.float32)
    g = np.full(100, 3e38, np.float32)  # huge but finite: accepted
    dst = np.empty_like(src)
    assert step_into(make_optimizer("sgd", 100), src, g, dst, 1e-40)
    g[57] = bad
    assert not step_into(make_optimizer("sgd", 100), src, g, dst, 0.1)
    np.testing.assert_array_equal(src, 1.0)


def test_shard_versions_never_write_a_buffer_a_reply_still_reads():
    from mpi4py import MPI

    from psgd.nn.optim import make_optimizer
    from psgd.ps.versions import ShardVersions
    comm = MPI.COMM_SELF
    opt = make_optimizer("sgd", 8)
    versions = ShardVersions(np.zeros(8, np.float32), spares=2)
    g = np.ones(8, np.float32)
    sinks, sent = [], []
    for k in range(1, 6):
        sent.append((versions.live, versions.live.copy()))
        versions.reply_sent(comm.Isend(versions.live, 0, k))   # not received yet: in flight
        if k <= 2:
            assert versions.step(opt, g, 1.0)
        else:  # every spare is read by a reply in flight: receive the oldest, then step
            sink = np.empty(8, np.float32)
            sinks.append(comm.Irecv(sink, 0, k - 2))
            MPI.Request.Waitall(sinks[-1:])
            assert versions.step(opt, g, 1.0)
        for buf, copy in sent[-2:]:     # the two newest replies' buffers were never written
            np.testing.assert_array_equal(buf, copy)
        np.testing.assert_array_equal(versions.live, -float(k))
    for k in range(4, 6):
        sink = np.empty(8, np.float32)
        comm.Recv(sink, 0, k)
        np.testing.assert_array_equal(sink, -float(k - 1))
    MPI.Request.Waitall(versions.all_requests())
    assert versions.n_waits == 0 and opt.steps == 5


@pytest.mark.parametrize("reply_in_flight", [False, True], ids=["in-place", "into-spare"])
@pytest.mark.parametrize("name", ["sgd", "momentum"])
def test_skipped_nonfinite_push_leaves_params_and_optimizer_state_untouched(name, reply_in_flight):
    from mpi4py import MPI

    from psgd.nn.optim import make_optimizer
    from psgd.ps.versions import ShardVersions
    opt = make_optimizer(name, 6, momentum=0.9)
    versions = ShardVersions(np.arange(6, dtype=np.float32))
    assert versions.step(opt, np.ones(6, np.float32), 0.1, skip_nonfinite=True)
    if reply_in_flight:
        versions.reply_sent(MPI.COMM_SELF.Isend(versions.live, 0, 9))
    live, state = versions.live.copy(), [getattr(opt, k).copy() for k in opt.state_keys]
    bad = np.ones(6, np.float32)
    bad[4] = np.nan
    assert not versions.step(opt, bad, 0.1, skip_nonfinite=True)
    np.testing.assert_array_equal(versions.live, live)
    for key, before in zip(opt.state_keys, state):
        np.testing.assert_array_equal(getattr(opt, key), before)
    assert opt.steps == 1
    if reply_in_flight:
        sink = np.empty(6, np.float32)
        MPI.COMM_SELF.Recv(sink, 0, 9)
        MPI.Request.Waitall(versions.all_requests())
        np.testing.assert_array_equal(sink, live)


@pytest.mark.parametrize("name", ["sgd", "momentum", "nesterov", "adam"])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_a_step_with_no_reply_in_flight_is_in_place_and_equals_the_step_into_a_spare(name, scale):
    from psgd.ps.versions import ShardVersions, step_into
    init, grads, (opt, ref) = _optimizer_case(name, seed=4, n=1003)
    versions = ShardVersions(init.copy())
    live = versions.live
    want = init.copy()
    for g in grads:
        assert versions.step(opt, g, 0.05, scale=scale)
        dst = np.empty_like(want)
        assert step_into(ref, want, g, dst, 0.05, scale)
        ref.steps += 1
        want = dst
    assert versions.live is live and versions.n_in_place == 3 and opt.steps == 3
    np.testing.assert_array_equal(versions.live, want)
    for key in ref.state_keys:
        np.testing.assert_array_equal(getattr(opt, key), getattr(ref, key))


def test_optimizer_step_with_check_reports_a_nonfinite_gradient():
    from psgd.nn.optim import make_optimizer
    for name in ("sgd", "momentum", "adam"):
        g = np.full(40, 3e38, np.float32)      # huge but finite: accepted
        assert make_optimizer(name, 40).step(np.zeros(40, np.float32), g, 1e-40, check=True)
        for bad in (np.nan, np.inf, -np.inf):
            g[33] = bad
            assert not make_optimizer(name, 40).step(np.zeros(40, np.float32), g, 0.1,
                                                     check=True)


@pytest.mark.parametrize("lent", [False, True], ids=["received", "lent"])
def test_bsp_rule_drops_a_nonfinite_push_from_the_sum_and_steps_with_the_mean_of_the_rest(lent):
    from psgd.nn.optim import make_optimizer
    from psgd.ps.bsp import BspUpdate
    from psgd.ps.versions import ShardVersions
    config = make_config("bsp", 5, lr_schedule=lambda c: 0.5, skip_nonfinite=True)
    versions = ShardVersions(np.zeros(5, np.float32))
    rule = BspUpdate(config, make_optimizer("sgd", 5), versions)
    for g, ok in ((1.0, True), (np.inf, False), (3.0, True)):
        buf = np.full(5, g, np.float32) if lent else rule.receive_buffer()
        buf[:] = g
        assert rule.push(buf, 0, 0, 3, borrowed=lent) is ok
    assert rule.advance(0, 1)
    np.testing.assert_array_equal(versions.live, np.full(5, -0.5 * 2.0, np.float32))


def test_server_result_staleness_summary():
    from psgd.mpi.report import ServerResult
    result = ServerResult(staleness_hist=np.array([2, 0, 1, 1], np.int64))
    assert result.max_staleness == 3
    assert result.mean_staleness == (0 * 2 + 2 * 1 + 3 * 1) / 4
    empty = ServerResult(staleness_hist=np.zeros(1, np.int64))
    assert empty.max_staleness == 0 and empty.mean_staleness == 0.0
