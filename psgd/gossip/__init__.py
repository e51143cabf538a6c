"""Decentralized training: mixing matrices, synchronous gossip (D-PSGD) and its asynchronous form (AD-PSGD)."""
