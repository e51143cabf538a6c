"""The MPI job's plumbing: waiting without spinning, roles, the shard map, shared memory, fault injection."""
