"""SharedCopies on a stage split over the ranks (tests/test_tensor_pipeline_servers.py).

Usage: tensor_pipeline_copies_check.py SPEC.  A stand-in worker pulls values of its own into
each part (part t: 100 (t + 1) + clock + local index); after start and step every part holds part 0's
values of the copies and its own elsewhere.  Rank 0 prints ``copies N``, ``wrong N``.
"""
import sys
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from psgd.errors import report_and_abort
from psgd.nn.model import build_model
from psgd.run.tensor_pipeline_servers import SharedCopies, stage_worker
from psgd.tensor.pipeline import stage_model


class Puller:
    """A worker half whose pulls write ``base + clock + index`` into the parameters."""

    def __init__(self, base: float) -> None:
        self.base, self.stats = base, {"max_staleness": 7}

    def start(self, params, clock=0):
        params[:] = self.base + clock + np.arange(params.size)

    def step(self, params, grad, clock, lr=None):
        self.start(params, clock + 1)


def main():
    comm = MPI.COMM_WORLD
    t = comm.Get_rank()
    settings = SimpleNamespace(model=sys.argv[1], seed=0, split=SimpleNamespace(dtype="float32"))
    info = {"input_shape": (1, 28, 28), "n_classes": 10}
    n = len(build_model(settings.model, seed=0, **info).layers)
    model = stage_model(settings, info, 0, n, comm)   # the whole model as one stage
    worker = SharedCopies(Puller(100.0 * (t + 1)), model, comm)
    wrong, first = 0, comm.bcast(worker.index, root=0)   # part 0's copies (widths may differ)
    for clock, call in enumerate((lambda p: worker.start(p, 0), lambda p: worker.step(p, p, 0))):
        call(model.params)
        own = 100.0 * (t + 1) + clock + np.arange(model.n_params)
        want = own.copy()
        want[worker.index] = 100.0 + clock + first   # part 0's values, in the same order
        wrong += int(np.count_nonzero(model.params != want.astype(np.float32)))
    wrong += worker.stats["max_staleness"] != 7   # the rest is the worker's
    run = SimpleNamespace(grid=SimpleNamespace(parts=2, tensor_comm=comm), model=model,
                          settings=SimpleNamespace(servers=2, protocol="bsp"))
    wrong += stage_worker(worker.worker, run) is not worker.worker   # bsp: not wrapped
    run.settings.protocol = "asp"
    wrong += not isinstance(stage_worker(worker.worker, run), SharedCopies)
    total = comm.reduce(wrong, root=0)
    if t == 0:
        print(f"copies {worker.index.size}")
        print(f"wrong {total}")


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:   # noqa: BLE001
        report_and_abort(exc)
