"""psgd plan's --spatial rows price the collectives a split step runs: the halo rows each
split layer exchanges (and their gradients back), the partial weight gradients' all-reduce
and the all-gather of the rows before the whole layers, recorded from a real step."""
from dataclasses import replace

import numpy as np
import pytest

from psgd.nn.model import build_model
from psgd.plan import profile as profiles
from psgd.plan.cost import Network
from psgd.plan.grid import group_price
from psgd.plan.search import Budget, _spatial_collectives, spatial_plans
from psgd.plan.tensor_time import Alone


@pytest.fixture(autouse=True)
def _short_crowd(monkeypatch):
    """The profile's crowd ratios over 10 ms of steps: their values are not checked here."""
    monkeypatch.setenv("PSGD_X_CROWD_SECONDS", "0.01")
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "1")


class Recording(Alone):
    """Rank ``rank`` of ``parts`` whose messages complete at once, each recorded in bytes by
    kind: the halo rows it receives, an all-reduce's buffer, an all-gather's whole result."""

    def __init__(self, parts, rank):
        super().__init__(parts, rank)
        self.bytes = {"halo": 0, "all-reduce": 0, "all-gather": 0}

    def Iallreduce(self, send, recv, op):
        self.bytes["all-reduce"] += send[0].nbytes
        return super().Iallreduce(send, recv, op)

    def Iallgatherv(self, send, recv):
        self.bytes["all-gather"] += recv[0].nbytes
        return super().Iallgatherv(send, recv)

    def Irecv(self, buf, source, tag):
        self.bytes["halo"] += buf.nbytes
        return super().Irecv(buf, source, tag)


SPEC, SHAPE = "conv:6x5:pad2-relu-pool:2-conv:8x5:pad2-relu-pool:2-flatten-dense:10", (1, 24, 24)


def test_a_spatial_rows_collectives_are_the_ones_the_middle_rank_of_a_split_step_runs():
    """On a link without latency every price is its bytes over the bandwidth, so the row's
    collective seconds are the recorded bytes' price. 24 rows over 3 ranks: the pools need no
    halo and each conv's is ``pad`` rows a side, so rank 1 of 3 is the busiest: it receives
    (and sends) ``pad`` rows from each neighbour forward and their gradients back."""
    from psgd.tensor.model import TensorModel
    from psgd.tensor.spatial import split_spatial
    batch, parts = 4, 3
    model = build_model(SPEC, seed=3, input_shape=SHAPE, n_classes=10)
    prof = profiles.profile_model(model, batch=batch, repeats=1)
    budget = Budget(parts, 1 << 40, Network(1e6, latency=0.0), batch=batch)
    comm = Recording(parts, 1)
    part = TensorModel(SPEC, split_spatial, comm, input_shape=model.input_shape, n_classes=model.n_classes)
    x = np.random.default_rng(0).standard_normal((batch, *model.input_shape)).astype(np.float32)
    part.loss_and_grad(x, np.arange(batch) % part.n_classes)
    assert all(comm.bytes.values())
    price = group_price(budget.net, budget.per_node, budget.cliques, parts, parts)
    want = sum(price(kind, n) for kind, n in comm.bytes.items())
    seconds, _ = _spatial_collectives(prof, budget, parts)
    assert seconds == pytest.approx(want, rel=1e-6)
    # and the row's step counts them: a slower link adds exactly their bytes' extra time
    slow = Budget(parts, 1 << 40, Network(5e5, latency=0.0), batch=batch)
    prof = replace(prof, spatial_max=parts)            # the profile times 2, 4 and 8 parts
    rows = [next(p for p in spatial_plans(prof, b) if p.parts == parts) for b in (budget, slow)]
    assert rows[1].step_s - rows[0].step_s == pytest.approx(want, rel=1e-6)
