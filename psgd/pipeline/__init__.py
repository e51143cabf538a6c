"""Pipeline-parallel training: a model cut into K stages, microbatches through them (GPipe, 1F1B)."""
