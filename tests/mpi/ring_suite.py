"""The ring tests in one launch: under ``mpiexec -n 5`` COMM_WORLD is split into communicators
of 1..5 ranks (as mpi4py runs its own suite under one mpiexec), and each runs ring_check, and
ring_train up to 4 ranks; on 3 ranks ring_train again with the window's reduce-scatter schedule
and with doubling only; ring_idle on 2. The ranks left out of a stage wait without spinning.
With ``--whole``: ring_check, ring_train and ring_idle once each on all of COMM_WORLD (across
emulated nodes)."""
import sys

import ring_check
import ring_idle
import ring_train
from mpi4py import MPI

from psgd.collectives import allreduce as ring
from psgd.errors import report_and_abort
from psgd.mpi import wait

world = MPI.COMM_WORLD


def on(k: int, check, **settings) -> None:
    """Run ``check(comm)`` on world ranks 0..k-1, with allreduce's module settings
    (``_small_bytes``, ``_shared_bytes``: what PSGD_X_ALLREDUCE_* set at import) changed."""
    sub = world.Split(0 if world.Get_rank() < k else MPI.UNDEFINED, world.Get_rank())
    if sub != MPI.COMM_NULL:
        saved = {name: getattr(ring, name) for name in settings}
        for name, value in settings.items():
            setattr(ring, name, value)
        try:
            check(sub)
        finally:
            for name, value in saved.items():
                setattr(ring, name, value)
            sub.Free()
    wait.barrier(world, f"the ranks of the {k}-rank stage of the ring suite")


def run(module):
    def check(comm):
        module.use(comm)
        module.main()
    return check


def main():
    if "--whole" in sys.argv:
        for module in (ring_check, ring_train, ring_idle):
            run(module)(world)
        return
    for k in range(1, world.Get_size() + 1):
        on(k, run(ring_check))
        if k <= 4:
            on(k, run(ring_train))
    if world.Get_size() >= 3:
        on(3, run(ring_train), _small_bytes=0)
        on(3, run(ring_train), _shared_bytes=0)
    if world.Get_size() >= 2:
        on(2, run(ring_idle))       # last: it sets the stall report to half a second
    if world.Get_rank() == 0:
        print("ring_suite: done")


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - one failing rank ends the job
        report_and_abort(exc)
