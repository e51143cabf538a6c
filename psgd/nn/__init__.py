"""Models, layers, optimizers and single-process training over flat float32 vectors; no MPI."""
