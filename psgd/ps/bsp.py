"""Bulk-synchronous parallel: the server averages all workers' gradients of clock c into one optimizer step.

When the last push of clock c arrives the server steps once with the mean
(so bsp equals SGD on the union of the batches) and ``lr_schedule(c)``; pulls
for clock c+1 are answered only after that step, so every push has staleness 0.
"""
from __future__ import annotations

import numpy as np

from psgd.config import ProtocolConfig
from psgd.errors import NonFinitePush
from psgd.kernels.finite import add_into, finite
from psgd.ps.update import UpdateRuleBase
from psgd.ps.versions import ShardVersions

STALENESS_BOUND = 0


class BspUpdate(UpdateRuleBase):
    """Accumulate the pushes of one clock; step when the version advances.

    Two float32 shard-length buffers: the sum and the receive buffer.  The
    first push of a clock becomes the sum; a later one is held and added
    (``incoming = sum + incoming``, then the two swap) only when the next push
    needs the buffer, so the last push is never added on its own: the step
    reads the sum and it in one pass (``grad2``).  Each push is checked for NaN/Inf in the
    first pass that reads it (or on arrival with ``skip_nonfinite``, or in
    :meth:`idle`); a bad one ends the job with :class:`psgd.errors.NonFinitePush`
    naming its sender, or is dropped with ``skip_nonfinite``.  Up to two lent
    pushes of a clock (``borrowed=True``, read in place from the push window)
    are only read, never written, and never copied when they are all there is.
    """

    def __init__(self, config: ProtocolConfig, optimizer, versions: ShardVersions,
                 n_workers: int = 1) -> None:
        self.config = config
        self.optimizer = optimizer
        self.versions = versions
        self.accum = np.zeros_like(versions.live)
        self.incoming = np.empty_like(versions.live)
        self.count = 0        # pushes of this clock taken: in the sum, plus the held one
        self.held = False     # ``incoming`` holds a push not yet added to the sum
        self.accum_src = None  # (rank, clock) of the one push in the sum while it is unchecked
        self.held_src = None   # (rank, clock) of the held push while it is unchecked
        # lent pushes of this clock, at most two and only while no push is in the buffers:
        # [gradient view, rank, clock, checked]
        self.lent: list[list] = []
        self.n_updates = 0

    def buffers(self) -> list:
        """The shard-length buffers this rule holds."""
        return [self.accum, self.incoming]

    def receive_buffer(self) -> np.ndarray:
        """Where the next push lands (lent pushes are copied in, a held push added to the sum)."""
        self._take_lent()
        return self._free_buffer()

    def renew_receive_buffer(self) -> None:
        """A receive into the last :meth:`receive_buffer` was abandoned (its sender was lost
        mid-transfer, and MPI may still write it): the next push lands in a new buffer."""
        self.incoming = np.empty_like(self.incoming)

    def _take_lent(self) -> None:
        """Copy the lent pushes of this clock into the rule's buffers, as if received there."""
        lent, self.lent = self.lent, []
        self.count -= len(lent)
        for grad, source, clock, _ in lent:
            buf = self._free_buffer()
            np.copyto(buf, grad)
            self._push_owned(buf, clock, source)

    def _free_buffer(self) -> np.ndarray:
        if self.held:
            ok = add_into(self.accum, self.incoming, check_total=self.accum_src is not None)
            if not ok:
                self._raise_unchecked(held_intact=False)
            self.accum, self.incoming = self.incoming, self.accum
            self.held, self.accum_src, self.held_src = False, None, None
        return self.incoming

    def push(self, grad: np.ndarray, clock: int, staleness: int, source: int,
             borrowed: bool = False, worker: int = 0) -> bool:
        """Take one worker's gradient (float32 shard length) for ``clock``.

        ``grad`` is the receive buffer, or with ``borrowed`` a lent push the
        rule only reads, until the version advances.  Returns False, and
        leaves the sum as it was, when ``grad`` is not finite and the config
        skips such pushes.
        """
        if borrowed:
            if self.count == len(self.lent) < 2:
                if self.config.skip_nonfinite and not finite(grad):
                    return False
                self.lent.append([grad, source, clock, self.config.skip_nonfinite])
                self.count += 1
                return True
            buf = self.receive_buffer()
            np.copyto(buf, grad)
            grad = buf
        return self._push_owned(grad, clock, source)

    def _push_owned(self, grad: np.ndarray, clock: int, source: int) -> bool:
        if self.config.skip_nonfinite:
            ok = finite(grad) if self.count == 0 else add_into(self.accum, grad)
            if not ok:
                return False
            self.accum, self.incoming = grad, self.accum
        elif self.count == 0:
            self.accum, self.incoming = grad, self.accum
            self.accum_src = (source, clock)
        else:
            self.held, self.held_src = True, (source, clock)
        self.count += 1
        return True

    def idle(self) -> None:
        """Check the pushes not yet checked while the server waits anyway; raises NonFinitePush."""
        self._raise_unchecked(held_intact=True)
        self.accum_src = self.held_src = None
        for entry in self.lent:
            if not entry[3] and not finite(entry[0]):
                raise NonFinitePush(entry[1], entry[2])
            entry[3] = True

    def advance(self, old_version: int, new_version: int) -> bool:
        """All workers pushed clock ``old_version``: apply the mean as one step.

        Returns False (no step) when the sum of finite pushes overflowed float32.
        """
        if self.count == 0:
            return True
        if self.lent:
            return self._advance_lent(old_version)
        count, self.count = self.count, 0
        held, self.held = self.held, False
        ok = self.versions.step(self.optimizer, self.accum,
                                self.config.lr_schedule(old_version), scale=1.0 / count,
                                skip_nonfinite=self.config.skip_nonfinite,
                                grad2=self.incoming if held else None)
        if not ok:
            self._raise_unchecked(held_intact=True)   # if it returns, the sum overflowed
        self.accum_src = self.held_src = None
        self.n_updates += ok
        return ok

    def _advance_lent(self, old_version: int) -> bool:
        """The step when this clock's pushes (one or two) are all lent: read in place."""
        lent, self.lent = self.lent, []
        grads = [entry[0] for entry in lent]
        self.count = 0
        skip = self.config.skip_nonfinite
        if skip and len(grads) == 2:   # the step must check the sum before it writes
            np.add(grads[0], grads[1], out=self.incoming)
            grads = [self.incoming]
        ok = self.versions.step(self.optimizer, grads[0], self.config.lr_schedule(old_version),
                                scale=1.0 / len(lent), skip_nonfinite=skip,
                                grad2=grads[1] if len(grads) == 2 else None)
        if not ok:   # name an unchecked push that holds NaN/Inf; else the sum overflowed
            for grad, source, clock, checked in lent:
                if not checked and not finite(grad):
                    raise NonFinitePush(source, clock)
        self.n_updates += ok
        return ok

    def _raise_unchecked(self, held_intact: bool) -> None:
        """Raise NonFinitePush for an unchecked push that holds NaN/Inf; return if none does.

        Called when a pass has found NaN/Inf (to name the push), and by
        :meth:`idle` (to check the pushes no pass has read yet).

        The sum buffer is never written by a failing pass; the held push is
        overwritten by a failed add (``held_intact=False``), and then it is
        the culprit when the sum is finite, since the add checks its operands.
        """
        if self.accum_src is not None and not finite(self.accum):
            raise NonFinitePush(*self.accum_src)
        if self.held_src is not None and (not held_intact or not finite(self.incoming)):
            raise NonFinitePush(*self.held_src)
