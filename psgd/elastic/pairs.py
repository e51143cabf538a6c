"""Elastic AD-PSGD: worker jobs merged into one communicator with a coordinator (rank 0), each
averaging pairwise with a neighbour as in :mod:`psgd.gossip.adpsgd`, going on without a lost one.

A member's role is fixed by its slot (even: active, odd: passive), so every wait is still an
active one's on a passive one, which never waits back. A member that sees its partner's pid
gone drops that pairing (its own parameters stay as they were); the coordinator watches every
pid and sends each survivor ``(epoch, live members)``, over which the partners are redrawn.
A passive member answers a request from any live member, whatever epoch it drew it in. Each
message carries the sender's pairing count and clock after its parameters, so the survivors
know the last state of a lost member that they averaged with (docs/design/elastic.md).
"""
from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

from psgd.elastic.alive import running
from psgd.elastic.ring import LOOK_S, RingBroken
from psgd.errors import PsgdError, UsageError
from psgd.gossip import topology
from psgd.gossip.adpsgd import choose

DONE, END, LIVE, FINAL = 4, 5, 6, 7   # between members and coordinator (DONE, END as the ring)
REQUEST, REPLY = 40, 41                # between members
HEADER = 2                             # the pairing count and clock after the parameters


def draw(live: list, name: str) -> dict:
    """Each live rank's partners: its neighbours on topology ``name`` over the live list
    (positions), of the other role (slot parity; rank r is slot r - 1); a member with none
    there takes every live member of the other role."""
    try:
        near = topology.neighbours(name, len(live))
    except UsageError:   # e.g. a torus over a prime number of survivors
        near = topology.neighbours("ring", len(live))
    out = {}
    for i, r in enumerate(live):
        mine = [live[j] for j in near[i] if (live[j] - r) % 2]
        out[r] = mine or [s for s in live if (s - r) % 2]
    return out


class PairsMember:
    """One member: ``gradient(clock)`` and ``step(clock, grad)`` are its model's; :meth:`run`
    goes over ``clocks`` clocks, then serves (passive) until the coordinator ends the run, and
    sends it the final parameters, its stats and what it knows of the lost members."""

    def __init__(self, comm: MPI.Intracomm, pids: list, clocks: int, gradient, step,
                 params: np.ndarray, name: str, seed: int, fault=None) -> None:
        self.comm, self.pids, self.clocks, self.params = comm, pids, clocks, params
        self.gradient, self.step, self.name, self.seed, self.fault = (gradient, step, name,
                                                                      int(seed), fault)
        self.rank, n = comm.Get_rank(), params.size
        self.active = (self.rank - 1) % 2 == 0
        self.live, self.epoch = list(range(1, comm.Get_size())), 0
        self.partners = draw(self.live, name)
        self.out, self.buf = np.empty(n + HEADER, np.float32), np.empty(n + HEADER, np.float32)
        self.count, self.clock = 0, 0
        self.last_with: dict = {}   # partner -> (its count, its clock, the pair's result)
        self.orphans: list = []     # what a pairing cut by a death left pending
        self.status = MPI.Status()
        self.stats = {"steps": 0, "averages": 0, "dropped_pairings": 0, "epochs": 0}

    def run(self) -> None:
        for clock in range(self.clocks):
            self.clock = clock
            self._hear()
            grad = self.gradient(clock)
            if self.active:
                options = [r for r in self.partners[self.rank] if r in self.live]
                if options:
                    self._pair(choose(self.seed, clock, self.rank - 1, options))
            else:
                self._serve()
            self.step(clock, grad)
            self.stats["steps"] += 1
        self._send_coordinator(None, DONE)
        while not self.comm.Iprobe(0, END):
            self._hear()
            if not self.active:
                self._serve()
            self._coordinator_alive()
            time.sleep(0.001)
        live = self.comm.recv(source=0, tag=END)
        lost = {r: (c, k, p) for r, (c, k, p) in self.last_with.items() if r not in live}
        self._send_coordinator((self.params, self.stats, lost), FINAL)
        while not self.comm.Iprobe(0, END):   # leave once the coordinator has it (a message
            self._coordinator_alive()         # sent may live in the sender's memory)
            time.sleep(LOOK_S)
        self.comm.recv(source=0, tag=END)

    def _send_coordinator(self, msg, tag: int) -> None:
        self._coordinator_alive()
        self.comm.send(msg, dest=0, tag=tag)

    def _coordinator_alive(self) -> None:
        if not running(self.pids[0]):
            raise RingBroken("the coordinator ended")

    def _hear(self) -> None:
        """Take the coordinator's newest live set, and redraw the partners over it."""
        while self.comm.Iprobe(0, LIVE):
            self.epoch, self.live = self.comm.recv(source=0, tag=LIVE)
            self.partners = draw(self.live, self.name)
            self.stats["epochs"] += 1

    def _message(self) -> np.ndarray:
        self.out[:-HEADER] = self.params
        self.out[-HEADER:] = (self.count, self.clock)
        return self.out

    def _average(self, partner: int) -> None:
        their_count, their_clock = self.buf[-HEADER:]
        np.add(self.params, self.buf[:-HEADER], out=self.params)
        self.params *= np.float32(0.5)
        self.count += 1
        self.stats["averages"] += 1
        self.last_with[partner] = (int(their_count), int(their_clock), self.params.copy())

    def _pair(self, partner: int) -> None:
        """An active member's average with ``partner``; dropped if the partner ends first."""
        if not running(self.pids[partner]):   # a send to a peer dead for long can crash MPICH
            self.stats["dropped_pairings"] += 1
            return
        recv = self.comm.Irecv(self.buf, source=partner, tag=REPLY)
        send = self.comm.Isend(self._message(), dest=partner, tag=REQUEST)
        if self.fault is not None:
            self.fault.at(self.clock)
        if self._wait(recv, partner):
            self._average(partner)
            if not self._wait(send, partner):   # the reply came, so the request was taken
                self.orphans.append(([send], self.out))
                self.out = np.empty_like(self.out)
        else:
            self._drop([recv, send])

    def _serve(self) -> None:
        """A passive member: answer every request pending now."""
        while self.comm.Iprobe(MPI.ANY_SOURCE, REQUEST, self.status):
            self._answer(self.status.Get_source())

    def _answer(self, active: int) -> None:
        """Take ``active``'s parameters, send back ours, keep the pair's mean; dropped if the
        active member ends before the reply is sent."""
        got = self.comm.Irecv(self.buf, source=active, tag=REQUEST)
        if not self._wait(got, active) or not running(self.pids[active]):
            self._drop([got])
            return
        send = self.comm.Isend(self._message(), dest=active, tag=REPLY)
        if self.fault is not None:
            self.fault.at(self.clock)
        self._average(active)
        if not self._wait(send, active):
            self._drop([send])

    def _wait(self, request: MPI.Request, peer: int) -> bool:
        """Whether ``request`` completed; False once ``peer`` has ended and it has not."""
        next_look = 0.0
        while not request.Test():
            now = time.monotonic()
            if now >= next_look:
                next_look = now + LOOK_S
                if not running(self.pids[peer]):
                    return bool(request.Test())
                self._coordinator_alive()
            time.sleep(0)
        return True

    def _drop(self, requests: list) -> None:
        """Leave a pairing cut by a death: cancel its receive, keep what MPI may still touch
        (never freed: the process leaves by os._exit), take fresh buffers."""
        for r in requests:
            try:
                if r:
                    r.Cancel()
            except MPI.Exception:
                pass
        self.orphans.append((requests, self.out, self.buf))
        self.out, self.buf = np.empty_like(self.out), np.empty_like(self.buf)
        self.stats["dropped_pairings"] += 1


class PairsCoordinator:
    """Rank 0: it watches the members' pids, tells the survivors each new live set, ends the
    run once every live member is done, and takes their final parameters."""

    def __init__(self, comm: MPI.Intracomm, pids: list, log) -> None:
        self.comm, self.pids, self.log = comm, pids, log
        self.live, self.epoch = list(range(1, comm.Get_size())), 0
        self.done: set = set()
        self.lost: dict = {}    # member -> {"after_s": ..., "epoch": ...}
        self.finals: dict = {}  # member -> (params, stats, what it knows of the lost)
        self.t0 = time.monotonic()

    def run(self) -> np.ndarray:
        """Until every live member is done; the mean of the survivors' parameters."""
        status = MPI.Status()
        while True:
            while self.comm.Iprobe(MPI.ANY_SOURCE, DONE, status):
                self.comm.recv(source=status.Get_source(), tag=DONE)
                self.done.add(status.Get_source())
            self._watch()
            if set(self.live) <= self.done:
                break
            time.sleep(LOOK_S)
        for r in self.live:
            if running(self.pids[r]):
                self.comm.send(self.live, dest=r, tag=END)
        for r in list(self.live):
            while not self.comm.Iprobe(r, FINAL):
                if not running(self.pids[r]):
                    break
                time.sleep(LOOK_S)
            else:
                self.finals[r] = self.comm.recv(source=r, tag=FINAL)
                continue
            self._watch()
        for r in self.finals:
            if running(self.pids[r]):
                self.comm.send(None, dest=r, tag=END)
        if not self.finals:
            raise PsgdError("every worker of the run was lost")
        return np.mean([f[0] for f in self.finals.values()], axis=0, dtype=np.float64
                       ).astype(np.float32)

    def _watch(self) -> None:
        """A member seen gone: a new epoch, sent to every survivor."""
        live = [r for r in self.live if running(self.pids[r])]
        if live == self.live:
            return
        if not live:
            raise PsgdError("every worker of the run was lost")
        self.epoch += 1
        after = time.monotonic() - self.t0
        for r in set(self.live) - set(live):
            self.lost[r] = {"after_s": after, "epoch": self.epoch}
            self.log.write("lost", worker=r - 1, why="its process ended", after_s=after,
                           epoch=self.epoch)
            print(f"psgd: worker {r - 1} lost (its process ended) {after:.1f} s into the run; "
                  f"{len(live)} worker(s) go on", flush=True)
        self.live = live
        for r in live:
            if running(self.pids[r]):
                self.comm.send((self.epoch, live), dest=r, tag=LIVE)

    def roster(self) -> list:
        """Each worker: its slot, state, steps and averages (a lost one: when it was seen
        gone, and its last pairing a survivor took part in: the clock and its count)."""
        out = []
        for r in range(1, self.comm.Get_size()):
            if r in self.finals:
                stats = self.finals[r][1]
                out.append({"worker": r - 1, "state": "done", "steps": stats["steps"],
                            "averages": stats["averages"],
                            "dropped_pairings": stats["dropped_pairings"]})
                continue
            seen = [f[2][r] for f in self.finals.values() if r in f[2]]
            last = max(seen, key=lambda s: s[0]) if seen else None
            out.append({"worker": r - 1, "state": "lost", **self.lost.get(r, {}),
                        "last_pairing_clock": last[1] if last else None,
                        "last_pairing_count": last[0] if last else None})
        return out

    def ghosts(self) -> dict:
        """Each lost member's parameters as of its last pairing with a survivor (the one of
        the highest count), or None where no survivor averaged with it."""
        out = {}
        for r in self.lost:
            seen = [f[2][r] for f in self.finals.values() if r in f[2]]
            out[r - 1] = max(seen, key=lambda s: s[0])[2] if seen else None
        return out


def dump(path: str, starts: np.ndarray, coordinator: PairsCoordinator) -> None:
    """Tests (PSGD_X_PAIRS_DUMP): every member's starting parameters, the survivors' final
    ones and the lost members' last known ones, as one .npz."""
    arrays = {f"start_{w}": starts[w] for w in range(len(starts))}
    arrays.update({f"final_{r - 1}": f[0] for r, f in coordinator.finals.items()})
    arrays.update({f"ghost_{w}": g for w, g in coordinator.ghosts().items() if g is not None})
    np.savez(path, **arrays)


DUMP_ENV = "PSGD_X_PAIRS_DUMP"


def dump_path() -> str | None:
    return os.environ.get(DUMP_ENV) or None
