"""psgd net's token bucket in the halo price: ``psgd net`` shapes its link with tbf, whose
bucket a pause refills, so a halo pass after a layer's compute sends its first bucket of bytes
at once (docs/results/plan-net.md has the timed exchanges); the runs under psgd net and the
bench price a split's halo that way, and no other link does."""
from types import SimpleNamespace

import pytest

from psgd.plan.cost import Network
from psgd.plan.grid import group_price
from psgd.run.grid_cost import network
from psgd.run.net import burst_bytes

FLAGS = SimpleNamespace(bandwidth=None, latency_us=None, per_node=None)


@pytest.mark.parametrize("rate_bps", [1e9, 1e10])
def test_a_run_under_psgd_net_prices_with_its_links_bucket(rate_bps):
    net, nodes, _ = network(FLAGS, {"PSGD_X_NET": f"{rate_bps:.0f},2"})
    assert (nodes, net.shared, net.bandwidth) == (2, True, rate_bps / 8)
    assert net.burst == burst_bytes(rate_bps) > 0
    # a flag's rate is another link than the emulator's: no bucket; outside psgd net none
    assert network(SimpleNamespace(**{**vars(FLAGS), "bandwidth": "1gbit"}),
                   {"PSGD_X_NET": f"{rate_bps:.0f},2"})[0].burst == 0
    assert network(FLAGS, {})[0].burst == 0


@pytest.mark.parametrize("down, up", [(100_000, 60_000), (262_144, 262_144), (1 << 20, 0), (0, 0)])
def test_a_halo_pass_after_compute_sends_its_first_bucket_as_copies(down, up):
    """2 parts on psgd net's 2 nodes (one shared link, both directions together): the pass's
    bytes beyond the bucket cost the link's rate, those within it the copies' rate; without a
    bucket, every byte the link's rate; on own links (a switch) the bucket is not used."""
    bucket, rate, copies, latency = 262_144.0, 1.25e8, 4e9, 50e-6
    shared = Network(rate, latency, shared=True, shm_bandwidth=copies)
    total, messages = down + up, max(down > 0, up > 0)
    halo = [[down, up]]

    def price(net, cliques):
        return group_price(net, 1, cliques, 2, 2)("halo", halo)
    early = min(bucket, total)
    assert price(Network(rate, latency, True, copies, burst=bucket), 2) == pytest.approx(
        (total - early) / rate + early / copies + messages * latency, abs=1e-12)
    assert price(shared, 2) == pytest.approx(total / rate + messages * latency, abs=1e-12)
    switch = Network(rate, latency, False, copies, burst=bucket)
    assert price(switch, None) == price(Network(rate, latency, False, copies), None)
