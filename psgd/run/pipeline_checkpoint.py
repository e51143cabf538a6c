"""A pipeline run's checkpoints: each stage resumes from its slice and saves its own part."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from psgd.mpi import wait
from psgd.run.checkpoint import Checkpoint, checkpoint_name, load_checkpoint
from psgd.run.checkpoint_parts import save_manifest, save_part

DELTA = "pipemare_delta"   # the optimizer-state key of pipemare's discrepancy-correction state


def resume_stage(settings, resumed, model, total: int) -> int:
    """The step the run starts at; the stage's slice of a checkpoint's parameters is loaded
    into ``model`` (each rank reads its own part of the flat vector)."""
    if resumed is None:
        return 0
    ckpt = load_checkpoint(resumed.path, (model.offset, model.offset + model.n_params))
    check_resumable(ckpt, resumed.path, settings, total, ckpt.params.shape == model.params.shape)
    model.params[:] = ckpt.params
    return ckpt.step


def check_resumable(ckpt, path, settings, total: int, same_shape: bool = True) -> None:
    """One clear ValueError where checkpoint ``ckpt`` (read from ``path``) is of another model
    or optimizer than the run's ``settings``, or leaves nothing of its ``total`` steps."""
    if ckpt.model_spec != settings.model or not same_shape:
        raise ValueError(f"checkpoint {path} is of model {ckpt.model_spec!r}, "
                         f"not --model {settings.model!r}")
    if ckpt.optimizer != settings.optimizer:
        raise ValueError(f"checkpoint {path} was trained with optimizer "
                         f"{ckpt.optimizer}; resume with --optimizer {ckpt.optimizer}")
    if ckpt.step >= total:
        raise ValueError(f"checkpoint {path} is at step {ckpt.step}, at or past the "
                         f"run's {total} steps: nothing left to train")


def extra_state(trainer) -> dict:
    """What an asynchronous stage keeps beside its optimizer's state, saved with it: pipemare's
    T2 estimate (:data:`DELTA`) and the --stage-comp method's per-element state."""
    state = {}
    correction = getattr(trainer, "correction", None)
    if correction is not None:
        state[DELTA] = correction.delta
    comp = getattr(trainer, "comp", None)
    if comp is not None:
        state.update(comp.state())
    return state


def load_extra_state(trainer, state: dict) -> None:
    """Take :func:`extra_state`'s arrays from ``state`` (a resumed part's optimizer state,
    which keeps the optimizer's own) into ``trainer``."""
    delta = state.pop(DELTA, None)
    correction = getattr(trainer, "correction", None)
    if delta is not None and correction is not None:
        correction.delta[:] = delta
    comp = getattr(trainer, "comp", None)
    if comp is not None:
        comp.load_state({k: state.pop(k) for k in list(comp.state()) if k in state})


def save(run, step: int) -> None:
    """Replica 0's stages of ``run`` (a :class:`psgd.run.pipeline_job.PipelineRun`) each write
    their part (parameters, optimizer state; with servers, the state its servers sent), then
    its stage 0 writes the manifest naming them: nothing is joined on one rank
    (:mod:`psgd.run.checkpoint_parts`)."""
    if run.grid.replica != 0:   # every replica holds the same
        return
    if run.groups is not None:
        at, params, state = run.groups.receive_state(final=step == run.total)
        if at not in (step, -1):
            raise AssertionError(f"stage {run.grid.stage}'s servers sent the state of step {at}, "
                                 f"not {step}")
    else:
        params = run.trainer.stage.params.copy()
        state = {**run.trainer.optimizer.state_dict(), **extra_state(run.trainer)}
    directory, row = Path(run.settings.checkpoint_dir), run.grid.row_comm
    if run.grid.stage == 0:   # a set rewritten (a resumed run's): its old manifest goes first
        (directory / checkpoint_name(step)).unlink(missing_ok=True)
    wait.wait(row.Ibarrier(), "stage 0 to drop an older manifest of this step")
    failed = None
    try:
        save_part(directory, step, run.grid.stage, params, state)
    except OSError as exc:
        failed = exc
    steps = [v for v in state.values() if np.ndim(v) == 0]
    mine = np.array([run.model.offset, run.model.offset + params.size, steps[-1] if steps else 0,
                     failed is None], np.int64)
    parts = np.zeros((run.grid.stages, 4), np.int64)
    wait.wait(row.Igather(mine, parts, root=0), "the stages to write their checkpoint parts")
    if failed is not None:
        raise ValueError(f"checkpoint part of step {step}: {failed}")
    if run.grid.stage == 0 and parts[:, 3].all():
        keys = [k for k, v in state.items() if np.ndim(v)]
        save_manifest(directory, header(run, step, int(parts[0, 2])), parts[:, :3].tolist(), keys,
                      keep=run.settings.checkpoint_keep)


def header(run, step: int, steps: int) -> Checkpoint:
    """The manifest's attributes (stage 0's optimizer step count)."""
    s = run.settings
    config = {**s.as_dict(), "pipeline": vars(run.options).copy()}
    return Checkpoint(params=np.empty(0, np.float32), model_spec=s.model, step=step,
                      optimizer=s.optimizer, opt_state={"steps": steps}, clocks=np.asarray([step] * run.grid.replicas),
                      protocol=s.protocol, seed=s.seed, config=config, run_id=run.run_id)
