"""The parameter server: messages, the worker and server halves, shard versions, the bsp and ssp rules."""
