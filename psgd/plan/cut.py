"""Pipeline rows of the planner: a cut's step time, bubble and memory under each schedule (the
cut itself from :func:`psgd.pipeline.partition.min_max_cut` under a memory cap)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from psgd.pipeline.schedules import ASYNCHRONOUS, in_flight
from psgd.plan import memory
from psgd.plan.profile import Profile


@lru_cache(maxsize=4096)
def stage_in_flight(schedule: str, stages: int, microbatches: int) -> tuple[int, ...]:
    """Stored microbatches per stage at the schedule's peak (PipeDream: its warm-up, K - s)."""
    m = max(microbatches, stages) if schedule in ASYNCHRONOUS else microbatches
    return tuple(in_flight(schedule, stages, s, m) for s in range(stages))


@dataclass(frozen=True)
class Stages:
    """A profile's prefix sums at one microbatch size, for O(1) stage times and memory.

    ``rerun``: more than one microbatch is in flight, so a stage runs each forward again
    before its backward (psgd.pipeline.stage keeps one forward's state per layer)."""

    profile: Profile
    microbatch: int
    link_s_per_byte: float
    latency: float
    rerun: bool = False

    def __post_init__(self):
        u, again = self.profile.units, 2 if self.rerun else 1
        object.__setattr__(self, "_compute", np.concatenate([[0.0], np.cumsum(
            [again * x.forward_at(self.microbatch) + x.backward_at(self.microbatch) for x in u])]))

    def seconds(self, i: int, j: int, last: bool) -> float:
        """Compute of units [i, j) on one microbatch, plus sending its output and receiving
        that output's gradient (none on the last stage)."""
        send = 0.0 if last else 2 * (self.latency + self.profile.units[j - 1].out_bytes
                                     * self.microbatch * self.link_s_per_byte)
        return float(self._compute[j] - self._compute[i]) + send

    def memory(self, i: int, j: int, flight: int, slots: int, schedule: str, replicated: bool) -> int:
        return memory.pipeline_stage(list(self.profile.units[i:j]), self.microbatch, flight,
                                     slots, weight_copies(schedule, flight), replicated)


def weight_copies(schedule: str, flight: int) -> int:
    """A stage's extra copies of its weights: pipedream's stash, one version per microbatch in
    flight (a backward's version is swapped with the current weights, not copied); pipemare's
    correction on a stage with a delay (``flight`` > 1): its update average, and the weights
    before a step or the predicted ones during a backward; none for gpipe and 1f1b."""
    if schedule == "pipedream":
        return flight
    return 2 if schedule == "pipemare" and flight > 1 else 0


def schedule_time(times: list[float], microbatches: int, asynchronous: bool) -> tuple[float, float]:
    """(seconds per batch, bubble) of stage times per microbatch: a synchronous schedule
    fills and drains once (the sum of the stages, then M - 1 of the slowest); PipeDream
    runs at the slowest stage's pace. The bubble is the stages' mean idle fraction."""
    slowest, k = max(times), len(times)
    span = microbatches * slowest if asynchronous else sum(times) + (microbatches - 1) * slowest
    return span, 1.0 - microbatches * sum(times) / (k * span)
