"""psgd's own all-reduce (ring, recursive doubling, a shared-memory window) and the allreduce protocol."""
