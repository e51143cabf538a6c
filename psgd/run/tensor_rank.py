"""`psgd train --tensor T`, `--spatial P`, `--grid D,T`: a grid of D data replicas x T model parts.

World rank w is part ``w % T`` of replica ``w // T``.  The T ranks of a replica split the
model (:mod:`psgd.tensor`) and read the same batches; the D replicas read their own
slices, and every parameter's gradient is averaged over them with psgd's all-reduce
before each rank steps its own part.  Flags this path does not carry are refused.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from psgd.collectives.allreduce import allreduce, free_all
from psgd.mpi import wait
from psgd.mpi.phase import phase
from psgd.nn.optim import make_optimizer, make_schedule
from psgd.protocols import get
from psgd.run import signals
from psgd.run.metrics import MetricsLog

# settings this path does not carry, as (field, value when unused, flag)
REFUSED = (("compress", "none", "--compress"), ("straggler", None, "--straggler"),
           ("record", None, "--record"), ("replay", None, "--replay"),
           ("timeline", None, "--timeline"), ("checkpoint_dir", None, "--checkpoint-dir"),
           ("resume", None, "--resume"), ("tensorboard", None, "--tensorboard"),
           ("augment", False, "--augment"), ("overlap", False, "--overlap"),
           ("skip_nonfinite", False, "--skip-nonfinite"), ("hold_hot", None, "--hold-hot"),
           ("eval_every", 0, "--eval-every"))


def wanted(s) -> bool:
    """Whether the settings ask for model parallelism inside layers."""
    return bool(s.tensor or s.spatial or s.grid)


def grid_shape(s, world: int) -> tuple[int, int, str]:
    """(D, T, axis) from --grid/--tensor/--spatial on ``world`` ranks; ValueError naming the flag."""
    if s.tensor and s.spatial:
        raise ValueError("give --tensor or --spatial, not both")
    axis, parts = ("spatial", s.spatial) if s.spatial else ("tensor", s.tensor)
    if parts is not None and parts < 1:
        raise ValueError(f"--{axis} {parts}: must be >= 1")
    if s.grid:
        try:
            d, t = (int(v) for v in str(s.grid).split(","))
        except ValueError:
            raise ValueError(f"--grid {s.grid!r}: expected D,T (two integers, e.g. 2,2)") from None
        if d < 1 or t < 1:
            raise ValueError(f"--grid {s.grid}: D and T must be >= 1")
        if parts is not None and parts != t:
            raise ValueError(f"--grid {s.grid} and --{axis} {parts} disagree on the model parts")
        if d * t != world:
            raise ValueError(f"--grid {s.grid} needs {d * t} ranks, the job has {world}")
        return d, t, axis
    if world % parts:
        raise ValueError(f"--{axis} {parts} does not divide the job's {world} ranks")
    return world // parts, parts, axis


def check(s, world: int) -> None:
    """Refuse what the tensor path does not run, one line each (no message is sent)."""
    _, _, axis = grid_shape(s, world)
    protocol = get(s.protocol)
    if protocol.servers or protocol.decentralized:
        raise ValueError(f"--{axis} averages the replicas' gradients by all-reduce: give a protocol "
                         f"without servers or neighbours (--protocol allreduce), not {s.protocol}")
    for name, unused, flag in REFUSED:
        if getattr(s, name) != unused:
            raise ValueError(f"{flag} is not supported with --{axis} or --grid")
    if s.lr_schedule == "optimal":
        raise ValueError(f"--lr-schedule optimal is not supported with --{axis} or --grid")


@dataclass
class TensorJob:
    """What train_main reads after the run: where it ended."""

    total_steps: int
    end_step: int


def run(comm, settings, debug: bool, agree) -> TensorJob:
    """Set up the grid and the split model (errors agreed as one line), then train."""
    d, t, axis = grid_shape(settings, comm.Get_size())
    rank = comm.Get_rank()
    with phase("splitting the grid"):
        part = comm.Split(rank // t, rank % t)
        replicas = comm.Split(rank % t, rank // t)
    setup = agree(comm, lambda: _build(settings, part, rank // t, d, axis), debug,
                  "build the split model", "agreeing that every rank could split the model")
    return _train(comm, part, replicas, settings, setup)


def _build(s, part, replica: int, n_replicas: int, axis: str) -> dict:
    from psgd.data.reader import ShardReader, dataset_info
    from psgd.nn.model import build_model
    from psgd.tensor.conv import split_tensor
    from psgd.tensor.model import TensorModel
    from psgd.tensor.spatial import split_spatial
    info = dataset_info(s.data)
    serial = build_model(s.model, seed=s.seed, input_shape=info["input_shape"], n_classes=info["n_classes"])
    model = TensorModel(serial, split_spatial if axis == "spatial" else split_tensor, part)
    reader = ShardReader(s.data, replica, n_replicas, s.batch_size, seed=s.seed)
    total = s.steps or max(1, int(round((s.epochs or 1.0) * reader.steps_per_epoch)))
    return {"serial": serial, "model": model, "reader": reader, "total": total, "axis": axis}


def _train(comm, part, replicas, s, setup: dict) -> TensorJob:
    model, reader, total = setup["model"], setup["reader"], setup["total"]
    n_rep = replicas.Get_size()
    opt = make_optimizer(s.optimizer, model.n_params, momentum=s.momentum, weight_decay=s.weight_decay)
    lr = make_schedule(s.lr_schedule, s.lr, total, warmup=s.warmup, step_every=s.lr_step_every,
                       gamma=s.lr_gamma)
    log = MetricsLog(s.log if comm.Get_rank() == 0 else None)
    stop, times, step = np.zeros(1, np.int64), [], 0
    sums = np.zeros(2)
    while step < total:
        t0 = time.perf_counter()
        x, y = reader.batch(step)
        model.reseed(reader.worker, step)
        loss, correct = model.loss_and_grad(x, y)
        if n_rep > 1:
            allreduce(replicas, model.grad, label="tensor grid gradients")
            model.grad /= n_rep
        opt.step(model.params, model.grad, lr(step))
        times.append(time.perf_counter() - t0)
        sums += (loss, correct / len(y))
        step += 1
        if step % s.log_every == 0 or step == total:
            _log_step(log, replicas, step, sums / (step % s.log_every or s.log_every))
            sums[:] = 0
        stop[0] = signals.received()
        wait.wait(comm.Iallreduce(MPI.IN_PLACE, stop, MPI.MAX), "the grid's stop check")
        if stop[0]:
            break
    _finish(comm, part, s, setup, log, step, times)
    free_all()
    if stop[0] and comm.Get_rank() == 0:
        print(f"psgd: stopped by {signals.signal_name(int(stop[0]))} at step {step} "
              f"(--{setup['axis']} keeps no checkpoint)", flush=True)
    return TensorJob(total_steps=total, end_step=step)


def _log_step(log, replicas, step: int, mean: np.ndarray) -> None:
    mean = mean.copy()
    allreduce(replicas, mean, label="tensor grid loss")
    mean /= replicas.Get_size()
    log.write("step", step=step, loss=float(mean[0]), train_acc=float(mean[1]))


def _finish(comm, part, s, setup: dict, log, step: int, times: list) -> None:
    """Evaluate the whole model on rank 0 and report time and memory per rank."""
    model, serial, reader = setup["model"], setup["serial"], setup["reader"]
    full = model.full_params()
    mine = np.array([model.param_bytes()], np.int64)
    most = np.zeros(1, np.int64)
    wait.wait(comm.Iallreduce(mine, most, MPI.MAX), "the grid's memory report")
    if comm.Get_rank() != 0:
        return
    serial.params = full
    serial.set_calibration(reader.calibration_rows(512)[0])
    x, y = reader.test_set()
    if s.eval_samples:
        x, y = x[:s.eval_samples], y[:s.eval_samples]
    loss, acc = serial.evaluate(x, y)
    ms = 1e3 * float(np.median(times[1:] or times))
    d, t = comm.Get_size() // part.Get_size(), part.Get_size()
    log.write("summary", steps=step, test_loss=loss, test_accuracy=acc, grid=[d, t], axis=setup["axis"],
              step_ms=ms, param_bytes_per_rank=int(most[0]), param_bytes_serial=int(serial.params.nbytes))
    log.close()
    print(f"psgd: {setup['axis']} grid D={d} x T={t}: {step} steps, test loss {loss:.4f}, "
          f"accuracy {acc:.4f}; median step {ms:.2f} ms; parameters {int(most[0])} bytes per rank "
          f"(whole model {serial.params.nbytes})", flush=True)
