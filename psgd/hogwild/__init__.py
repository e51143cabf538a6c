"""Hogwild: lock-free one-sided updates into the servers' RMA windows."""
