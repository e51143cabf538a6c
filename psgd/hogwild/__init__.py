"""Hogwild: lock-free one-sided updates into the servers' RMA windows."""

DEFAULT_HOLD = 8   # --hold-hot's default: steps a sparse worker holds its hot rows' changes
