"""A protocol added from outside psgd: ``toymean``, the workers' mean gradient by one
MPI_Iallreduce, then each worker's own optimizer step (one module, one registration)."""
import numpy as np
from mpi4py import MPI

from psgd.halves import WorkerHalf
from psgd.mpi import wait
from psgd.nn.optim import make_optimizer
from psgd.plan.cost import ring_step_s
from psgd.protocols import Protocol, register


class MeanWorker(WorkerHalf):
    """Every worker holds the whole model; a step averages the gradients and steps."""

    def __init__(self, roles, shard_map, config):
        self.comm = roles.worker_comm
        self.optimizer = make_optimizer(config.optimizer, config.n_params, **config.opt_hparams)
        self.stats = {"steps": 0}

    def start(self, params, clock=0):
        wait.wait(self.comm.Ibcast(params, root=0), "worker 0 to send the initial parameters")

    def step(self, params, grad, clock, lr):
        wait.wait(self.comm.Iallreduce(MPI.IN_PLACE, grad, op=MPI.SUM),
                  f"the other workers' gradients of clock {clock}")
        grad /= np.float32(self.comm.Get_size())
        self.optimizer.step(params, grad, lr)
        self.stats["steps"] += 1

    def finish(self):
        return self.stats


def rows(job, net, name):
    """``psgd plan``'s row: one all-reduce of the gradient per step, synchronous."""
    return {name: (ring_step_s(job, net), True)}


register(Protocol(
    "toymean", servers=False, worker="toy_protocol:MeanWorker", optimizers=("sgd", "momentum"),
    reasons={"optimizer": "a toy"}, cost="toy_protocol:rows",
    example={"ranks": 2, "config": "tests/toys/toymean.toml"},
    summary="a toy from outside psgd: the mean gradient by MPI_Iallreduce, then each "
            "worker's step"))
