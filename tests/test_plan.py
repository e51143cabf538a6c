"""The cost model against hand-computed cases, and `psgd plan`'s refusals."""
import subprocess
import sys

import pytest

from psgd.plan.cost import (Compression, Job, Network, async_rate, balanced_servers, bsp_step_s,
                            closed_loop_rate, expected_touched, hierarchical_step_s, predict,
                            recommend, ring_step_s)

B = 4e6                    # bytes of a 1M-parameter model
BW = 1e8                   # bytes/s
SHM = 1e9
TC = 64 * 1e-3             # compute per step: 64 samples at 1 ms
ENC, DEC = 1e-10, 2e-10    # seconds per float32 byte


def job(**kw):
    return Job(**{"n_params": 1_000_000, "compute_s": 1e-3, "batch": 64, "workers": 4, **kw})


def test_ring_one_rank_per_node_is_2_n_minus_1_over_n_bytes_on_each_link():
    net = Network(BW, 1e-5)
    assert ring_step_s(job(), net) == pytest.approx(TC + 2 * 3 / 4 * B / BW + 6 * 1e-5)


def test_ring_on_one_shared_link_carries_every_ranks_bytes():
    net = Network(BW, 0.0, shared=True)
    assert ring_step_s(job(), net) == pytest.approx(TC + 4 * 2 * 3 / 4 * B / BW)


def test_small_buffers_take_recursive_doubling_log2_n_exchanges():
    net = Network(BW, 1e-5)
    small = job(n_params=1000)                      # 4 KB < SMALL_BYTES
    assert ring_step_s(small, net) == pytest.approx(TC + 2 * (4000 / BW + 1e-5))


def test_hierarchical_on_2_cliques_moves_2b_over_the_shared_link_plus_the_window():
    net = Network(BW, 0.0, shared=True, shm_bandwidth=SHM)
    # ranks 0, 2 on node 0 and 1, 3 on node 1; leaders 0 and 1 ring: each sends B
    assert hierarchical_step_s(job(cliques=2), net) == pytest.approx(TC + 2 * B / BW + 4 * B / SHM)
    # the flat ring there: every hop crosses (0->1->2->3->0), 4 x 1.5 B
    assert ring_step_s(job(cliques=2), net) == pytest.approx(TC + 6 * B / BW)


def test_hierarchical_with_one_rank_per_node_is_the_flat_ring():
    net = Network(BW, 1e-5)
    assert hierarchical_step_s(job(), net) == pytest.approx(ring_step_s(job(), net))


def test_bsp_on_a_shared_link_computes_while_the_next_worker_pulls():
    # server 0 and worker 2 on node 0, workers 1 and 3 on node 1; the replies cross the
    # link one at a time (B/BW each), worker 2 copies its own in (B/SHM)
    L = 1e-5
    net = Network(BW, L, shared=True, shm_bandwidth=SHM)
    j = job(workers=3, servers=1, cliques=2)
    ready1, ready2, ready3 = B / BW + L + TC, B / SHM + L + TC, 2 * B / BW + L + TC
    # pushes queue behind the pulls: worker 1's, then worker 3's as soon as it is ready
    land1 = max(2 * B / BW, ready1) + B / BW + L
    land3 = max(land1 - L, ready3) + B / BW + L
    # the server copies worker 2's push in and adds it, adds each as it lands, then steps
    done = ready2 + L + 2 * B / SHM
    done = max(done, land1) + B / SHM
    done = max(done, land3) + B / SHM
    assert bsp_step_s(j, net) == pytest.approx(done + 4 * B / SHM)
    # the phases one after another would take longer by the overlap
    assert bsp_step_s(j, net) < TC + 2 * (2 * B / BW + B / SHM + L) + 7 * B / SHM - B / BW


def test_bsp_on_a_shared_link_with_a_server_on_each_node():
    # servers 0 and 1 on nodes 0 and 1, workers 2, 3, 4 on nodes 0, 1, 0: each pulls B/2
    # across (in turn) and copies B/2 in from its own node's server, then pushes the same way
    net = Network(BW, 0.0, shared=True, shm_bandwidth=SHM)
    j = job(workers=3, servers=2, cliques=2)
    half = B / 2
    last_ready = 3 * half / BW + half / SHM + TC       # worker 4: the third reply across
    last_landed = last_ready + half / BW                # its push goes straight onto the link
    # each server copies in and adds the last push, then steps its half
    assert bsp_step_s(j, net) == pytest.approx(last_landed + 2 * half / SHM + 4 * half / SHM)


def test_bsp_on_a_shared_link_with_no_compute_is_every_transfer_in_turn():
    net = Network(BW, 0.0, shared=True, shm_bandwidth=SHM)
    j = job(workers=3, servers=1, cliques=4, compute_s=1e-9)    # every worker across
    # three pulls, three pushes back to back; only the last add and the step follow them
    assert bsp_step_s(j, net) == pytest.approx(6 * B / BW + B / SHM + 4 * B / SHM)


def test_bsp_on_a_shared_link_encodes_before_the_push_and_decodes_as_it_lands():
    net = Network(BW, 0.0, shared=True, shm_bandwidth=SHM)
    j = job(workers=2, servers=1, cliques=3, compression=Compression(8.0, ENC, DEC))
    # worker 2's reply lands B/BW after worker 1's; its push (B/8) is the last to land
    last = 2 * B / BW + TC + ENC * B + B / 8 / BW
    assert bsp_step_s(j, net) == pytest.approx(last + DEC * B + B / SHM + 4 * B / SHM)


def test_bsp_server_link_is_the_bottleneck_until_s_matches_w():
    net = Network(BW, 0.0, shm_bandwidth=SHM)
    one = bsp_step_s(job(workers=4, servers=1), net)
    four = bsp_step_s(job(workers=4, servers=4), net)
    assert one == pytest.approx(TC + 2 * 4 * B / BW + 8 * B / SHM)     # 4 pushes into one link
    assert four == pytest.approx(TC + 2 * B / BW + 8 * B / 4 / SHM)


def test_asp_rate_is_each_workers_cycle_until_the_link_or_the_server_is_full():
    net = Network(BW, 0.0, shm_bandwidth=SHM)
    fast = job(workers=2, servers=2, compute_s=1.0)               # compute-bound
    # each cycles compute and B/2 to and from each server, then queues for a server's
    # step (read B/2, 4 passes over it) and for the busiest link (B a round: B/2 per
    # step): the first finds no queue, the second the first's share of both (mean
    # value analysis, two clients, two stations)
    d, link = 5 * B / 2 / SHM, B / 2 / BW
    z = 64.0 + 2 * B / BW - link
    first = 1 / (z + d + link)
    assert async_rate(fast, net) == pytest.approx(2 / (z + d * (1 + first * d)
                                                        + link * (1 + first * link)))
    # many workers of no compute fill the server's link: 1 / (B / bw) steps/s
    full = job(workers=64, servers=1, compute_s=1e-6)
    assert async_rate(full, net) == pytest.approx(64 * BW / (64 * B))
    shared = Network(BW, 0.0, shared=True, shm_bandwidth=SHM)      # push and pull share it
    assert async_rate(full, shared) == pytest.approx(64 * BW / (2 * 64 * B))
    # 8 such workers queue short of it: mean value analysis gives under the bound
    assert 0.99 * 8 * BW / (8 * B) < async_rate(job(workers=8, servers=1, compute_s=1e-6), net) \
        < 8 * BW / (8 * B)
    # a link that never fills: each server steps for one push at a time
    slow = job(workers=8, servers=1, compute_s=1e-6)
    wide = Network(1e12, 0.0, shm_bandwidth=SHM)
    assert async_rate(slow, wide) == pytest.approx(SHM / (5 * B), rel=1e-3)
    assert async_rate(job(workers=8, servers=2, compute_s=1e-6), wide) == \
        pytest.approx(SHM / (5 * B / 2), rel=1e-3)


def test_closed_loop_rate_by_hand():
    assert closed_loop_rate(1, 3.0, 1.0) == pytest.approx(1 / 4)
    # two clients: the second finds 1/4 x 1 s of queue; 2 / (3 + 1.25)
    assert closed_loop_rate(2, 3.0, 1.0) == pytest.approx(2 / 4.25)
    # three: queue after two = (2 / 4.25) x 1.25; response 1 + that
    q2 = 2 / 4.25 * 1.25
    assert closed_loop_rate(3, 3.0, 1.0) == pytest.approx(3 / (3 + 1 + q2))
    assert closed_loop_rate(50, 0.0, 0.5) == pytest.approx(2.0)      # the station saturated
    assert closed_loop_rate(4, 1e6, 1.0) == pytest.approx(4 / (1e6 + 1), rel=1e-5)  # no queue
    # two stations of 1 s and 2 s: one client cycles in 1 + 1 + 2 = 4 s, leaving queues of
    # 1/4 and 2/4; the second waits 1.25 s and 3 s: 2 / (1 + 4.25)
    assert closed_loop_rate(2, 1.0, [1.0, 2.0]) == pytest.approx(2 / 5.25)
    assert closed_loop_rate(2, 1.0, [0.0, 2.0]) == pytest.approx(closed_loop_rate(2, 1.0, 2.0))


def test_hogwild_transfers_queue_for_the_shared_link_of_two_cliques():
    # bench-net's placement: server 0 and worker 2 on node 0, workers 1 and 3 on node 1;
    # each worker adds B and reads B, then steps its own B (4 passes), no server step
    j = job(workers=3, servers=1, cliques=2)
    net = Network(BW, 0.0, shared=True, shm_bandwidth=SHM)
    remote = TC + 2 * B / BW + 4 * B / SHM
    local = TC + 2 * B / SHM + 4 * B / SHM
    alone = 2 / remote + 1 / local                    # steps/s were nothing shared
    link = 2 * 2 * B / 3 / BW                         # the link's seconds per step: 4B a round
    z = 3 / alone - link
    x1 = 1 / (z + link)                               # mean value analysis over the link
    x2 = 2 / (z + link * (1 + x1 * link))
    r3 = link * (1 + x2 * link * (1 + x1 * link))
    rate = async_rate(j, net, B, B, B)
    assert rate == pytest.approx(3 / (z + r3))
    assert rate < min(alone, 3 * BW / (4 * B))        # below both bounds near their knee
    assert predict(j, net)["hogwild"]["samples_per_s"] == pytest.approx(64 * rate)


def test_cores_shared_by_more_workers_slow_the_compute():
    assert job(workers=4, cores=2).compute_step_s == pytest.approx(2 * TC)
    assert job(workers=1, cores=2).compute_step_s == pytest.approx(TC)


def test_balanced_servers_match_total_worker_bandwidth():
    assert balanced_servers(16, 10.0, 10.0) == 16
    assert balanced_servers(16, 10.0, 40.0) == 4
    assert balanced_servers(3, 10.0, 40.0) == 1


def test_predict_rows_and_the_recommendation_prefers_sync_unless_async_is_much_faster():
    p = predict(job(workers=4, servers=4), Network(BW, 1e-5))
    assert set(p) == {"bsp", "ssp", "asp", "hogwild", "allreduce ring", "allreduce hierarchical",
                      "gossip", "adpsgd"}
    for row in p.values():
        assert row["samples_per_s"] == pytest.approx(4 * 64 / row["step_s"])
        assert 0 < row["efficiency"] <= 1
    table = {"bsp": {"samples_per_s": 100, "sync": True}, "asp": {"samples_per_s": 110,
                                                                  "sync": False}}
    assert recommend(table) == "bsp"
    table["asp"]["samples_per_s"] = 130
    assert recommend(table) == "asp"



def test_bsp_compressed_pushes_shrink_by_the_ratio_pulls_stay_float32_plus_the_codec():
    net = Network(BW, 0.0, shm_bandwidth=SHM)
    j = job(workers=2, servers=1, compression=Compression(8.0, ENC, DEC))
    # the server's link takes 2 pushes of B/8 in, sends 2 pulls of B out; it encodes
    # once per worker step and decodes both workers' pushes
    expected = TC + 2 * B / 8 / BW + 2 * B / BW + 6 * B / SHM + (ENC + 2 * DEC) * B
    assert bsp_step_s(j, net) == pytest.approx(expected)
    assert bsp_step_s(job(workers=2, servers=1), net) == pytest.approx(TC + 4 * B / BW + 6 * B / SHM)


def test_asp_compressed_cycle_and_shared_link_cap():
    c = Compression(10.0, ENC, DEC)
    net = Network(BW, 0.0, shm_bandwidth=SHM)
    one = job(workers=1, servers=1, compression=c)
    assert async_rate(one, net) == pytest.approx(
        1 / (TC + B / 10 / BW + B / BW + (ENC + DEC) * B + 5 * B / SHM))
    shared = Network(BW, 0.0, shared=True, shm_bandwidth=SHM)
    fast = job(workers=4, servers=1, compute_s=1e-9, compression=Compression(10.0))
    # 4 pushes of B/10 and 4 pulls of B share the one link per round: 64 such workers fill it
    full = job(workers=64, servers=1, compute_s=1e-9, compression=Compression(10.0))
    assert async_rate(full, shared) == pytest.approx(64 * BW / (64 * B / 10 + 64 * B))
    assert async_rate(fast, shared) < 4 * BW / (4 * B / 10 + 4 * B)


@pytest.mark.parametrize("ring", [True, False])
def test_compressed_allreduce_fp16_ring_or_all_gather(ring):
    net = Network(BW, 0.0)
    j = job(workers=4, compression=Compression(2.0 if ring else 32.0, ENC, DEC, ring=ring))
    if ring:    # 2(N-1)/N of B/2 on each link; encode B, decode (2N-1)/N of B
        expected = TC + 1.5 * B / 2 / BW + (ENC + DEC * 7 / 4) * B
    else:       # N-1 encodings of B/32 to the right neighbour; encode B, decode N of B
        expected = TC + 3 * B / 32 / BW + (ENC + 4 * DEC) * B
    assert ring_step_s(j, net) == pytest.approx(expected)
    # a ring of ratio 1 and free coding is the plain ring
    assert ring_step_s(job(workers=4, compression=Compression(1.0, 0.0, 0.0)), net) == \
        pytest.approx(ring_step_s(job(workers=4), net))


def test_predict_under_compression_names_the_gather_and_leaves_hogwild_alone():
    net = Network(BW, 1e-5)
    plain = predict(job(workers=4, servers=4), net)
    coded = predict(job(workers=4, servers=4, compression=Compression(32.0, ring=False)), net)
    assert "allreduce gather" in coded and "allreduce hierarchical" not in coded
    assert coded["hogwild"] == plain["hogwild"]
    assert coded["asp"]["step_s"] < plain["asp"]["step_s"]
    assert coded["allreduce gather"]["step_s"] < plain["allreduce ring"]["step_s"]


def test_plan_measures_the_compressor_it_is_given():
    proc = subprocess.run([sys.executable, "-m", "psgd", "plan", "--params", "1e6",
                           "--compute-us", "100", "--workers", "4", "--compress", "topk:0.01"],
                          capture_output=True, text=True, check=True)
    assert "--compress topk:0.01: 50.0x fewer bytes per push" in proc.stdout
    assert proc.stdout.count("allreduce gather") == 1


@pytest.mark.parametrize("args, words", [
    (["--workers", "4", "--compress", "zip"], "--compress 'zip' is not one of"),
    (["--ranks", "4", "--servers", "4"], "--ranks 4 needs --servers S with 0 <= S < 4"),
    (["--workers", "4", "--bandwidth", "0gbit"], "--bandwidth must be > 0"),
    (["--workers", "4", "--bandwidth", "fast"], "is not a bandwidth"),
    (["--workers", "4", "--servers", "-1"], "need >= 1 worker and >= 0 servers"),
    (["--workers", "0"], "need >= 1 worker"),
])
def test_plan_rejects_impossible_inputs_with_one_line(args, words):
    proc = subprocess.run([sys.executable, "-m", "psgd", "plan", "--params", "1e6",
                           "--compute-us", "100", *args], capture_output=True, text=True)
    assert proc.returncode != 0
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


def test_plan_prints_every_protocol_and_one_recommendation():
    proc = subprocess.run([sys.executable, "-m", "psgd", "plan", "--params", "2e6",
                           "--compute-us", "300", "--workers", "16,64", "--bandwidth", "10gbit"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.count("<- recommended") == 2
    assert proc.stdout.count("allreduce hierarchical") == 2


def test_expected_touched_rows_of_a_sparse_batch():
    # one draw touches one feature row and the bias row; every feature once at most D rows
    assert expected_touched(1000, 10, 1, 1) == pytest.approx(20)
    assert expected_touched(4, 3, 2, 1) == pytest.approx(3 * (1 + 4 * (1 - 0.75 ** 2)))
    assert expected_touched(50, 10, 1000, 64) == pytest.approx(10 * 51)


def test_sparse_hogwild_moves_index_and_value_per_touched_coordinate_both_ways():
    net = Network(BW, 0.0, shm_bandwidth=SHM)
    sparse = job(workers=1, servers=1, touched=1000.0)
    assert sparse.update_bytes == 8000
    p = predict(sparse, net)
    # the worker's own step, 4 passes over what it touched, and no server step
    assert p["hogwild"]["step_s"] == pytest.approx(TC + 2 * 8000 / BW + 4 * 8000 / SHM)
    dense = predict(job(workers=1, servers=1), net)
    assert dense["hogwild"]["step_s"] == pytest.approx(TC + 2 * B / BW + 4 * B / SHM)
    assert p["asp"] == dense["asp"]              # a PS push is float32 without --compress sparse
    with pytest.raises(ValueError, match="must touch between 1 and"):
        predict(job(workers=1, servers=1, touched=2e6), net)


def test_plan_models_a_sparse_linear_model_from_its_nonzeros():
    proc = subprocess.run([sys.executable, "-m", "psgd", "plan", "--model", "linear:1000-10",
                           "--nnz", "1", "--batch-size", "1", "--compute-us", "10", "--workers",
                           "2", "--servers", "1", "--compress", "sparse"],
                          capture_output=True, text=True, check=True)
    assert "touches about 20 coordinates (0.20%); a hogwild update and read move 160 bytes" \
        in proc.stdout, proc.stdout
    assert "fewer bytes per push" in proc.stdout


@pytest.mark.parametrize("args, words", [
    (["--model", "linear:1000-10"], "needs --nnz N > 0"),
    (["--model", "svm"], "give the sizes"),
    (["--params", "1e6", "--nnz", "5"], "--nnz describes sparse data"),
])
def test_plan_refuses_sparse_inputs_that_do_not_fit_with_one_line(args, words):
    proc = subprocess.run([sys.executable, "-m", "psgd", "plan", "--compute-us", "10",
                           "--workers", "2", *args], capture_output=True, text=True)
    assert proc.returncode != 0
    assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_gossip_hides_most_of_the_ring_exchange_behind_compute_and_adpsgd_pays_one_swap():
    """4 workers, one per node on a switch: a gossip worker sends B to each of its 2 ring
    neighbours and receives 2 B, HIDDEN_EXCHANGE of it under the next gradient (at most that
    gradient's compute); on one node none of it; adpsgd swaps B each way with one partner
    after it, asynchronously."""
    from psgd.plan.cost import HIDDEN_EXCHANGE
    net = Network(BW, 0.0, shm_bandwidth=SHM)
    p = predict(job(servers=1), net)
    exchange = 2 * B / BW
    assert p["gossip"]["step_s"] == pytest.approx(
        TC + exchange - min(HIDDEN_EXCHANGE * exchange, TC) + (3 + 4) * B / SHM)
    one_node = predict(job(servers=1, per_node=8), net)
    assert one_node["gossip"]["step_s"] == pytest.approx(TC + 2 * B / SHM + (3 + 4) * B / SHM)
    assert p["adpsgd"]["step_s"] == pytest.approx(TC + B / BW + (2 + 4) * B / SHM)
    assert p["gossip"]["sync"] and not p["adpsgd"]["sync"]


def test_every_registry_entry_with_a_cost_model_gets_its_rows(monkeypatch):
    from psgd.protocols import PROTOCOLS, Protocol
    entry = Protocol("lockstep", servers=False, worker="psgd.gossip.dpsgd:GossipWorker",
                     summary="a test protocol", cost="psgd.plan.rows:adpsgd_rows")
    monkeypatch.setitem(PROTOCOLS, "lockstep", entry)
    p = predict(job(servers=1), Network(BW, 0.0))
    assert p["lockstep"] == p["adpsgd"]
    assert {n.split()[0] for n in p} == {n for n, e in PROTOCOLS.items() if e.cost}
