"""The elastic servers' links: a worker's message whose data stops coming mid-receive.

A push's payload matched by a probe (its rendezvous header arrived) whose sender dies before
the data moves never completes: the receive must end in WorkerLost after the silence, and
its buffer, which MPI may still write, must never be used again.
"""
import time

import numpy as np
import pytest
from mpi4py import MPI

from psgd.elastic.links import Links, WorkerLost, _Receiving
from psgd.mpi import wait
from psgd.nn.optim import make_optimizer
from psgd.ps.bsp import BspUpdate
from psgd.ps.ssp import SspUpdate
from psgd.ps.versions import ShardVersions
from psgd.protocols.features import make_config

SILENCE_S = 0.2


def test_a_matched_receive_that_never_completes_ends_in_worker_lost_with_its_buffer_aside():
    links = Links(MPI.COMM_SELF, slots=2, silence_s=SILENCE_S)
    buf = np.zeros(8, np.float32)
    req = MPI.COMM_SELF.Irecv(buf, 0, tag=4242)   # nobody sends it: it never completes
    links.heard[1] = time.monotonic()
    receiving = _Receiving(req, links, 1, buf)
    t0 = time.monotonic()
    with pytest.raises(WorkerLost) as lost:
        wait.wait(receiving, "a payload that never comes")
    assert SILENCE_S <= time.monotonic() - t0 < SILENCE_S + 2.0
    assert lost.value.w == 1 and lost.value.aside is buf
    assert links.aside == [(req, buf)]   # kept alive, never waited on
    req.Cancel()
    req.Wait()


def test_the_others_silence_while_a_receive_held_the_loop_is_not_counted_against_them():
    links = Links(MPI.COMM_SELF, slots=3, silence_s=SILENCE_S)
    for w in range(3):
        links.add(w, MPI.COMM_SELF)
    buf = np.zeros(8, np.float32)
    req = MPI.COMM_SELF.Irecv(buf, 0, tag=4243)   # worker 1's payload, which never comes
    with pytest.raises(WorkerLost):
        wait.wait(_Receiving(req, links, 1, buf), "a payload that never comes")
    links.drop(1, lost=True)
    for w in (0, 2):   # their messages were not probed while the loop waited on worker 1
        links.check_heard(w)
    time.sleep(SILENCE_S * 1.5)
    with pytest.raises(WorkerLost):   # from then on their silence counts again
        links.check_heard(0)
    req.Cancel()
    req.Wait()


def test_a_receive_that_completes_counts_as_hearing_from_the_worker():
    links = Links(MPI.COMM_SELF, slots=1, silence_s=SILENCE_S)
    buf, sent = np.zeros(4, np.float32), np.arange(4, dtype=np.float32)
    req = MPI.COMM_SELF.Irecv(buf, 0, tag=7)
    links.heard[0] = time.monotonic() - 10 * SILENCE_S   # silent long before the data came
    MPI.COMM_SELF.Send(sent, 0, tag=7)
    wait.wait(_Receiving(req, links, 0, buf), "a payload that came")
    np.testing.assert_array_equal(buf, sent)
    assert time.monotonic() - links.heard[0] < SILENCE_S and links.aside == []


@pytest.mark.parametrize("rule,protocol", [(BspUpdate, "bsp"), (SspUpdate, "asp")])
def test_a_renewed_receive_buffer_shares_no_memory_and_the_rule_steps_as_before(rule, protocol):
    n, lr = 6, 0.5
    config = make_config(protocol, n, lr_schedule=lambda clock: lr)
    versions = ShardVersions(np.ones(n, np.float32))
    update = rule(config, make_optimizer("sgd", n), versions, n_workers=1)
    aside = update.receive_buffer()
    aside[:] = 99.0                        # what a late write of the abandoned receive leaves
    update.renew_receive_buffer()
    fresh = update.receive_buffer()
    assert not np.shares_memory(fresh, aside)
    fresh[:] = np.arange(n, dtype=np.float32)
    assert update.push(fresh, 0, 0, source=1)
    update.advance(0, 1)
    aside[:] = -99.0                       # the abandoned buffer written after the step
    np.testing.assert_allclose(versions.live, 1.0 - lr * np.arange(n))
