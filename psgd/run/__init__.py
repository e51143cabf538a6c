"""A rank's job in `psgd train`: settings, set-up, the worker and server roles, metrics, checkpoints."""
