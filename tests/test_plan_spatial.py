"""psgd plan's --spatial rows price the collectives a split step runs: the halo rows each
split layer exchanges (and their gradients back), the partial weight gradients' all-reduce
and the all-gather of the rows before the whole layers, recorded from a real step."""
import functools
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
    kind: an all-reduce's buffer, an all-gather's whole result; and per halo pass (each call of
    the halo exchange or its adjoint) the halo bytes it sends and those it receives."""

    def __init__(self, parts, rank):
        super().__init__(parts, rank)
        self.bytes = {"all-reduce": 0, "all-gather": 0}
        self.passes = []                  # [sent, received] per halo pass

    def Iallreduce(self, send, recv, op):
        self.bytes["all-reduce"] += send[0].nbytes
        return super().Iallreduce(send, recv, op)

    def Iallgatherv(self, send, recv):
        self.bytes["all-gather"] += recv[0].nbytes
        return super().Iallgatherv(send, recv)

    def Isend(self, buf, dest, tag):
        self.passes[-1][0] += buf.nbytes
        return super().Isend(buf, dest, tag)

    def Irecv(self, buf, source, tag):
        self.passes[-1][1] += buf.nbytes
        return super().Irecv(buf, source, tag)


SPEC, SHAPE = "conv:6x5:pad2-relu-pool:2-conv:8x5:pad2-relu-pool:2-flatten-dense:10", (1, 24, 24)


def _split_step(spec, model, comm, batch, monkeypatch):
    """One training step of ``spec`` split by height as rank ``comm``, each halo pass opened in
    ``comm.passes`` as the exchange (or its adjoint) starts."""
    from psgd.tensor import primitives as pr
    from psgd.tensor.model import TensorModel
    from psgd.tensor.spatial import split_spatial
    for name in ("halo_forward", "halo_adjoint"):
        def opened(*args, _f=getattr(pr, name)):
            comm.passes.append([0, 0])
            return _f(*args)
        monkeypatch.setattr(pr, name, opened)
    part = TensorModel(spec, split_spatial, comm, input_shape=model.input_shape, n_classes=model.n_classes)
    x = np.random.default_rng(0).standard_normal((batch, *model.input_shape)).astype(np.float32)
    part.loss_and_grad(x, np.arange(batch) % part.n_classes)
    monkeypatch.undo()
    return comm


@functools.lru_cache(maxsize=None)
def _profiled(spec, shape, batch):
    """The model and its profile, without crowd ratios (a core each here: they are not used)."""
    model = build_model(spec, seed=3, input_shape=shape, n_classes=10 if shape else None)
    crowd, profiles._crowd_ratios = profiles._crowd_ratios, lambda *args: {}
    try:
        return model, profiles.profile_model(model, batch=batch, repeats=1)
    finally:
        profiles._crowd_ratios = crowd


@pytest.mark.parametrize("shared", [False, True], ids=["own-links", "shared-link"])
@pytest.mark.parametrize("spec, shape, parts", [(SPEC, SHAPE, 3), ("lenet", None, 2), ("lenet", None, 3)])
def test_a_spatial_rows_collectives_are_the_bytes_a_split_step_moves(spec, shape, parts, shared, monkeypatch):
    """On links without latency every price is its bytes over the bandwidth, so the row's
    collective seconds are the recorded bytes' price: the all-reduces and all-gathers (the same
    on every rank), and for each halo pass (forward and back), with one rank a node, the most
    bytes any rank sends or receives in it; on ``psgd net``'s one shared link (rank r on node
    r mod 2: every neighbour across it), every byte any rank sends. Lenet's 28 rows over 3
    ranks split 10/9/9 (the pools' one-sided halos); over 2 a rank sends all its halo rows to
    its one neighbour: the price counts what each part sends each neighbour."""
    batch, link = 4, Network(1e6, latency=0.0, shared=shared)
    model, prof = _profiled(spec, shape, batch)
    budget = Budget(parts, 1 << 40, link, batch=batch, cliques=2 if shared else None)
    ranks = [_split_step(spec, model, Recording(parts, r), batch, monkeypatch) for r in range(parts)]
    assert all(ranks[1].bytes.values()) and all(c.bytes == ranks[0].bytes for c in ranks)
    passes = zip(*(c.passes for c in ranks))        # each pass: (sent, received) per rank
    halo = [sum(s for s, _ in p) if shared else max(max(sr) for sr in p) for p in passes]
    assert sum(halo) > 0
    price = group_price(budget.net, budget.per_node, budget.cliques, parts, parts)
    want = sum(price(kind, n) for kind, n in ranks[0].bytes.items()) + sum(halo) / link.bandwidth
    seconds, _ = _spatial_collectives(prof, budget, parts)
    assert seconds == pytest.approx(want, rel=1e-6)
    # and the row's step counts them: a slower link adds exactly their bytes' extra time
    slow = replace(budget, net=replace(link, bandwidth=link.bandwidth / 2))
    prof = replace(prof, spatial_max=parts)            # the profile times 2, 4 and 8 parts
    rows = [next(p for p in spatial_plans(prof, b) if p.parts == parts) for b in (budget, slow)]
    assert rows[1].step_s - rows[0].step_s == pytest.approx(want, rel=1e-6)
