"""The options of model parallelism inside layers (psgd.run.tensor_rank): its flags and one check."""
from __future__ import annotations

from dataclasses import dataclass

from psgd.errors import UsageError
from psgd.protocols.options import Options

DTYPES = ("float32", "float64")
_NOT_CARRIED = "this path does not carry it"


@dataclass(frozen=True)
class TensorOptions(Options):
    """Dense layers split over ranks (--tensor), images split by height (--spatial), the grid."""

    KEY, TITLE = "split", "model parallelism inside layers"
    REFUSES = dict.fromkeys(("compress", "straggler", "record", "replay", "tensorboard", "augment",
                             "overlap", "skip_nonfinite", "hold_hot", "eval_every"), _NOT_CARRIED)
    FLAGS = {
        "tensor": (int, "split every dense layer over T ranks, Megatron-style (column- then "
                        "row-parallel pairs); the job's ranks / T data replicas (--protocol "
                        "allreduce, or bsp, ssp, asp with --servers a multiple of T; "
                        "see docs/guide/tensor.md)"),
        "spatial": (int, "split conv, pool and batch-norm layers over P ranks by image height, "
                         "with halo exchange (--protocol allreduce; see docs/guide/tensor.md)"),
        "grid": (str, "D,T: D data replicas x T model parts (--tensor, or --spatial when given); "
                      "auto or D,auto: each layer split its own way over the ranks (or each "
                      "replica's ranks), priced on --bandwidth, --latency-us, --per-node"),
        "dtype": (str, "float32 (default) or float64: the parameters, activations and optimizer "
                       "state of a --tensor/--spatial/--grid run (float64 for checks against "
                       "serial to round-off)"),
    }

    tensor: int | None = None
    spatial: int | None = None
    grid: str | None = None
    dtype: str = "float32"

    def wanted(self) -> bool:
        """Whether the run splits its model over ranks."""
        return bool(self.tensor or self.spatial or self.grid)

    def refusal(self, name: str, why: str) -> str:
        axis = "spatial" if self.spatial else "tensor"
        return f"--{name.replace('_', '-')} is not supported with --{axis} or --grid"

    def resolved(self, plan, protocol) -> TensorOptions:
        """UsageError naming the flag: an unknown --dtype, or float64 outside a split run."""
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype {self.dtype}: choose one of {', '.join(DTYPES)}")
        if self.dtype != "float32" and not self.wanted():
            raise UsageError(f"--dtype {self.dtype} runs only with --tensor, --spatial or --grid "
                             f"(--grid 1,1 on one rank is the serial run)")
        return self


def auto_grid(grid) -> bool:
    """Whether --grid lets each layer choose its split (auto, or D,auto)."""
    return str(grid).split(",")[-1].strip() == "auto"
