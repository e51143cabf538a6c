"""psgd plan's count of a --tensor split's collectives equals what the split model runs: one
training step of the real split layers on a communicator that records each collective."""
import numpy as np
import pytest

from psgd.nn.model import build_model
from psgd.plan.profile import profile_model
from psgd.plan.tensor_comm import tensor_collectives
from psgd.plan.tensor_time import Alone
from psgd.tensor.conv import split_tensor
from psgd.tensor.model import TensorModel


@pytest.fixture(autouse=True)
def _short_crowd(monkeypatch):
    """The profile's crowd ratios over 10 ms of steps (subprocesses too): their values are not
    what these tests check."""
    monkeypatch.setenv("PSGD_X_CROWD_SECONDS", "0.01")
    monkeypatch.setenv("PSGD_X_CROWD_REPEATS", "1")


class RecordingComm(Alone):
    """Rank 0 of 2 whose collectives complete at once (the other rank adds zeros) and are
    recorded as (kind, bytes): an all-reduce's buffer, an all-gather's whole result."""

    def __init__(self):
        super().__init__(2)
        self.calls = []

    def Iallreduce(self, send, recv, op):
        self.calls.append(("all-reduce", send[0].nbytes))
        return super().Iallreduce(send, recv, op)

    def Iallgatherv(self, send, recv):
        self.calls.append(("all-gather", recv[0].nbytes))
        return super().Iallgatherv(send, recv)


SPECS = [("mlp:30-16-12-10", None),                       # a pair, then a column that gathers
         ("mlp:30-16-12-8-10", None),                     # two pairs
         ("conv:6x3:pad1-bn-relu-pool:2-conv:5x3:s2-relu-conv:7x3:pad1-bn-relu-gap-dense:9-relu-dense:5",
          (3, 12, 12)),
         ("conv:8x3:pad1-bn-relu-res:8-res:12:s2-gap-dropout:0.5-dense:5", (3, 16, 16))]


@pytest.mark.parametrize("spec, shape", SPECS)
def test_the_planned_collectives_are_the_ones_a_split_step_runs(spec, shape):
    batch = 4
    serial = build_model(spec, seed=3, input_shape=shape, n_classes=5)
    units = profile_model(serial, batch=batch, repeats=1).units
    comm = RecordingComm()
    model = TensorModel(spec, split_tensor, comm, seed=3, input_shape=shape, n_classes=5)
    x = np.random.default_rng(0).standard_normal((batch, *serial.input_shape)).astype(np.float32)
    model.loss_and_grad(x, np.arange(batch) % 5)
    ran = sorted((kind, n // batch) for kind, n in comm.calls)
    assert ran and sorted(tensor_collectives(units)) == ran
