"""Checkpoints of tensor-split pipeline stages: each stage's parts gather its slice of the serial
flat vectors on part 0, which writes it as an unsplit stage's part (psgd.run.pipeline_checkpoint)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from psgd.errors import UsageError
from psgd.run.checkpoint import load_checkpoint
from psgd.run.pipeline_checkpoint import check_resumable, extra_state
from psgd.run.pipeline_checkpoint import save as save_stages
from psgd.tensor import primitives as pr


def span_range(model) -> tuple[int, int]:
    """[lo, hi) of the serial flat vector that stage ``model`` (a split span) holds."""
    size = lambda layers: sum(int(np.prod(s)) for layer in layers  # noqa: E731
                              for _, s in layer.param_shapes())
    a, b = model.span
    lo = size(model.serial_layers[:a])
    return lo, lo + size(model.serial_layers[a:b])


def gather_span(model, local: np.ndarray) -> np.ndarray | None:
    """``local`` (laid out as the part's :attr:`params`) as the stage's slice of the serial flat
    vector on part 0, None on the other parts (collective over the stage's parts)."""
    lo, hi = span_range(model)
    root = model.comm.Get_rank() == 0
    out = np.zeros(hi - lo, local.dtype) if root else None
    for a, b, block in model.owned_blocks(local):
        request = model.comm.Ireduce(block, out[a - lo:b - lo] if root else None, MPI.SUM, root=0)
        pr.wait(request, "part 0 to gather the stage's checkpoint slice")
    return out


def save(run, step: int) -> None:
    """Replica 0's stages each gather their parts' parameters and optimizer state (under
    servers, what each part's servers send) on part 0, whose row of stages writes them as a
    pipeline's parts and manifest: the set is the one an unsplit pipeline with this cut
    writes, and is made only once every part is on disk."""
    if run.grid.replica != 0:
        return
    model = run.model
    if run.groups is not None:   # the state the (stage, part)'s servers send
        at, params, state = run.groups.receive_state(final=step == run.total)
        if at not in (step, -1):
            raise AssertionError(f"stage {run.grid.stage} part {run.grid.part}'s servers sent "
                                 f"the state of step {at}, not {step}")
    else:
        params = run.trainer.stage.params
        state = {**run.trainer.optimizer.state_dict(), **extra_state(run.trainer)}   # pipemare's
    params = gather_span(model, params)
    state = {k: gather_span(model, v) if np.ndim(v) else v for k, v in state.items()}
    if run.grid.part != 0:
        return
    lo, _ = span_range(model)
    stage = SimpleNamespace(params=params)
    saved = SimpleNamespace(state_dict=lambda: state)
    proxy = SimpleNamespace(grid=run.grid, groups=None, settings=run.settings, options=run.options,
                            run_id=run.run_id, model=SimpleNamespace(offset=lo),
                            trainer=SimpleNamespace(stage=stage, optimizer=saved))
    save_stages(proxy, step)


def resume(settings, resumed, model, total: int):
    """The step the run starts at and the part's optimizer state (None for a fresh run); the
    part's own values of the checkpoint's parameters are loaded into ``model``."""
    if resumed is None:
        return 0, None

    def take(read, n: int):
        if n != model.n_total:
            raise UsageError(f"checkpoint {resumed.path} holds {n} parameters, model "
                             f"{model.spec} has {model.n_total}")
        return model.take_flat(read)
    ckpt = load_checkpoint(resumed.path, take=take)
    check_resumable(ckpt, resumed.path, settings, total)
    model.params[:] = ckpt.params
    return ckpt.step, ckpt.opt_state
