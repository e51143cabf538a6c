"""The flags of model parallelism inside layers (psgd.run.tensor_rank), and their one check."""
from __future__ import annotations

DTYPES = ("float32", "float64")

FLAGS: dict[str, tuple[type, str]] = {
    "tensor": (int, "split every dense layer over T ranks, Megatron-style (column- then "
                    "row-parallel pairs); the job's ranks / T data replicas (--protocol allreduce, or bsp, "
                    "ssp, asp with --servers a multiple of T; "
                    "see docs/guide/tensor.md)"),
    "spatial": (int, "split conv, pool and batch-norm layers over P ranks by image height, with "
                     "halo exchange (--protocol allreduce; see docs/guide/tensor.md)"),
    "grid": (str, "D,T: D data replicas x T model parts (--tensor, or --spatial when given)"),
    "dtype": (str, "float32 (default) or float64: the parameters, activations and optimizer "
                   "state of a --tensor/--spatial/--grid run (float64 for checks against serial "
                   "to round-off)"),
}


def check(s) -> None:
    """ValueError naming the flag: an unknown --dtype, or float64 outside a split run."""
    if s.dtype not in DTYPES:
        raise ValueError(f"--dtype {s.dtype}: choose one of {', '.join(DTYPES)}")
    if s.dtype != "float32" and not (s.tensor or s.spatial or s.grid):
        raise ValueError(f"--dtype {s.dtype} runs only with --tensor, --spatial or --grid "
                         f"(--grid 1,1 on one rank is the serial run)")
