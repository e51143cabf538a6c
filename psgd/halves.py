"""The base of every worker half: the optional capabilities with their defaults.

The run loop (:mod:`psgd.run.worker_rank`) calls each of these on every worker half; a
half overrides only what it does.  The typed interfaces are in
:mod:`psgd.protocols.interfaces`.
"""
from __future__ import annotations


class WorkerHalf:
    """Defaults for a worker half's optional methods: each does nothing.

    Attributes
    ----------
    momentum : psgd.compress.momentum.WorkerMomentum or None
        The velocity the worker keeps under ``--momentum-correction`` (restored on resume).
    serve : callable or None
        What to run while the run's stop checks wait (adpsgd's passive worker answers requests).
    compensation : dict or None
        What ``--staleness-comp`` did on this worker, for the run's summary.
    grad_buffer : ndarray or None
        Where the gradient should be computed (the servers of this node read it there).
    """

    momentum = None
    serve = None
    compensation = None
    grad_buffer = None

    def use_model(self, model) -> None:
        """Told the model before the run (hogwild: a sparse model's rows move alone)."""

    def before_batch(self, params, x) -> None:
        """Called with each batch ``x`` before its gradient (hogwild: read its rows)."""

    def runs_steps(self) -> bool:
        """Whether ``run_steps(params, x, y, rows, clock, lrs)`` takes runs of steps in one call."""
        return False

    def read_all(self, params) -> None:
        """Make ``params`` whole before it is evaluated or saved (a worker reading rows only)."""
