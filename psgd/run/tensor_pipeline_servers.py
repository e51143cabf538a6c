"""Parameter servers of tensor-split pipeline stages: each (stage, part) is one server group
(psgd.run.tensor_servers), its D replicas pushing the part's own vector to its own shards.

:class:`psgd.pipeline.grid.TensorGrid` ranks (stage s, part t) of a replica ``s T + t``, so
the K x T groups are the grid's (stage, part) pairs in the order ServerGroups counts them.
Under ssp and asp each group steps its copies of the values every part holds (the layers on
samples, a row layer's bias) in its own order, so after each pull the stage's parts take
part 0's (:class:`SharedCopies`, as plain --tensor servers do in psgd.run.tensor_rank).
"""
from __future__ import annotations

from psgd.run.tensor_rank import copies, share_copies, shares_copies


def groups(stages: int, parts: int) -> int:
    """The server groups of a pipeline of ``stages`` stages split over ``parts``: one per
    (stage, part), each owning ``--servers / (K T)`` of the servers."""
    return stages * parts


def refused(given: dict) -> str | None:
    """The line refusing a server setting split stages do not run (None: they run it)."""
    if given.get("spatial"):
        return ("--spatial does not work under --pipeline with a parameter-server protocol: "
                "the servers of stages split by rows are not built; use --protocol allreduce")
    for flag in ("record", "replay"):
        if given.get(flag):
            return (f"--{flag} does not work with tensor-split stages over servers: the "
                    f"record and replay of their K x T server groups are not built; record "
                    f"an unsplit pipeline (no --tensor)")
    return None


class SharedCopies:
    """A stage part's worker half (``worker``) whose pulls end with every part of the stage
    holding part 0's values of the copies (collective over ``tensor_comm``); the rest of
    the worker (``stats``, ``finish``) is ``worker``'s."""

    def __init__(self, worker, model, tensor_comm) -> None:
        self.worker, self.model, self.tensor_comm = worker, model, tensor_comm
        self.index = copies(model)

    def __getattr__(self, name):
        return getattr(self.worker, name)

    def start(self, params: np.ndarray, clock: int = 0) -> None:
        """Pull ``params`` (the stage's view of the whole part's vector), then share."""
        self.worker.start(params, clock)
        share_copies(self.tensor_comm, self.model, self.index)

    def step(self, params: np.ndarray, grad: np.ndarray, clock: int, lr=None) -> None:
        """Push ``grad``, pull the next ``params``, then share."""
        self.worker.step(params, grad, clock, lr)
        share_copies(self.tensor_comm, self.model, self.index)


def stage_worker(worker, run):
    """``worker`` for a split stage under ``run``'s protocol: wrapped in
    :class:`SharedCopies` under ssp and asp, as it is under bsp (whose groups step every
    copy on the same sums)."""
    if getattr(run.grid, "parts", 1) > 1 and shares_copies(run.settings):
        return SharedCopies(worker, run.model, run.grid.tensor_comm)
    return worker
