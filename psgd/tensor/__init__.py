"""Model parallelism inside a layer: tensor (Megatron) and spatial (halo) splits, and their primitives."""
