"""Elastic asynchronous training: a server job that worker jobs join and leave while it trains."""
import os


def no_cross_memory_attach() -> None:
    """Before MPI starts: keep UCX from reading a peer's memory in place (CMA). When a worker job
    dies while the servers read its push that way, UCX aborts the server job; its other
    shared-memory transports copy through a segment and leave the survivor standing. A
    UCX_TLS the user set is kept."""
    os.environ.setdefault("UCX_TLS", "^cma")
