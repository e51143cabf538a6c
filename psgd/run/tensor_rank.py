"""`psgd train --tensor T`, `--spatial P`, `--grid D,T`: a grid of D data replicas x T model parts.

World rank w is part ``w % T`` of replica ``w // T``.  The T ranks of a replica split the
model (:mod:`psgd.tensor`): each draws, trains and evaluates only its own part, and they
read the same batches; the D replicas read their own slices, and every parameter's gradient
is averaged over them with psgd's all-reduce before each rank steps its own part.
Checkpoints hold the serial flat vector (replica 0's parts gathered on rank 0 on save, each
rank reading its own rows on load), so any grid or a plain run resumes them; under
parameter servers each part's servers send replica 0 their state to save.
Flags this path does not carry are refused (TensorOptions.REFUSES, psgd.run.tensor_flags).
"""
from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
from mpi4py import MPI

from psgd.collectives.allreduce import allreduce, free_all
from psgd.errors import UsageError
from psgd.mpi import timeline, wait
from psgd.mpi.phase import phase
from psgd.nn.optim import make_optimizer, make_schedule
from psgd.protocols import get
from psgd.run import signals, tensor_servers
from psgd.run.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from psgd.run.resume import agreed_run_id, announce, check_checkpoint_dir, resume_checkpoint
from psgd.run.run_plan import refused_by
from psgd.run.tensor_flags import auto_grid
from psgd.run.tensor_servers import servers_of
from psgd.run.metrics import MetricsLog
from psgd.tensor.layer_times import LayerTimes, activation_bytes

def grid_shape(s, world: int) -> tuple[int, int, str]:
    """(D, T, axis) from --grid/--tensor/--spatial on ``world`` ranks; ValueError naming the flag."""
    if s.tensor and s.spatial:
        raise ValueError("give --tensor or --spatial, not both")
    axis, parts = ("spatial", s.spatial) if s.spatial else ("tensor", s.tensor)
    if parts is not None and parts < 1:
        raise ValueError(f"--{axis} {parts}: must be >= 1")
    if auto_grid(s.grid):
        if parts is not None:
            raise ValueError(f"--grid {s.grid} chooses each layer's split itself; drop --{axis}")
        return _auto_shape(s.grid, world)
    if s.grid:
        try:
            d, t = (int(v) for v in str(s.grid).split(","))
        except ValueError:
            raise ValueError(f"--grid {s.grid!r}: expected D,T (two integers, e.g. 2,2) or auto") from None
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


def _auto_shape(grid: str, world: int) -> tuple[int, int, str]:
    """(D, T, "auto") of --grid D,auto on ``world`` ranks; of plain --grid auto, (world, 1,
    "auto") until :func:`choose_grid` picks D and T in the run."""
    d = world if grid == "auto" else grid.split(",")[0]
    try:
        d = int(d)
    except ValueError:
        raise ValueError(f"--grid {grid!r}: expected auto or D,auto (D an integer, e.g. 2,auto)") from None
    if d < 1 or world % d:
        raise ValueError(f"--grid {grid}: D must be >= 1 and divide the job's {world} ranks")
    return d, world // d, "auto"


def check(s, world: int) -> None:
    """Refuse what the tensor path does not run, one line each (no message is sent)."""
    if servers_of(s) >= world:
        raise ValueError(f"--servers {s.servers} leaves no rank for the grid: the job has {world}")
    _, t, axis = grid_shape(s.split, world - servers_of(s))
    tensor_servers.check(s, t, axis)
    line = refused_by(s.split, s.as_dict())
    if line:
        raise ValueError(line)
    if s.lr_schedule == "optimal":
        raise ValueError(f"--lr-schedule optimal is not supported with --{axis} or --grid")


@dataclass
class TensorJob:
    """What train_main reads after the run: where it ended."""

    total_steps: int
    end_step: int


def run(comm, settings, resumed, debug: bool, agree, network=None) -> TensorJob:
    """Set up the grid (and its server groups) and the split model (errors agreed as one
    line), then train; a server rank serves its part's group. ``network``: the flags
    --grid auto prices on (:func:`psgd.run.plan_job.network_flags`)."""
    n_servers = servers_of(settings)
    d, t, axis = grid_shape(settings.split, comm.Get_size() - n_servers)
    chosen = {}
    if settings.split.grid == "auto":
        d, t, chosen = agree(comm, lambda: choose_grid(settings, comm.Get_size() - n_servers, network),
                             debug, "choose the grid", "agreeing on the grid --grid auto chose")
    with phase("agreeing on the run id"):
        run_id = agreed_run_id(comm, resumed)
    groups = tensor_servers.ServerGroups(comm, settings, t) if n_servers else None
    with phase("splitting the grid"):
        grid = tensor_servers.workers_comm(comm, n_servers) if n_servers else comm
        if grid is not None:
            rank = grid.Get_rank()
            part, replicas = grid.Split(rank // t, rank % t), grid.Split(rank % t, rank // t)
    build = (lambda: None) if grid is None else \
        (lambda: {**_build(settings, part, rank // t, d, axis, resumed, run_id, network), "grids": chosen})
    setup = agree(comm, build, debug, "build the split model and load the checkpoint",
                  "agreeing that every rank could split the model")
    if grid is None:
        groups.serve(groups.share(None, 0))
        return TensorJob(total_steps=0, end_step=0)
    if groups is not None:
        groups.share(setup["model"].params, setup["total"], setup["start"], setup.pop("opt_state"))
        setup["worker"], setup["groups"] = groups.worker(), groups
        if shares_copies(settings):
            setup["copies"] = copies(setup["model"])
    if grid.Get_rank() == 0:
        announce(SimpleNamespace(settings=settings, run_id=run_id, foreign=setup["foreign"]), resumed)
    return _train(grid, part, replicas, settings, setup)


def choose_grid(s, world: int, network) -> tuple[int, int, dict]:
    """Plain --grid auto: (D, T, every grid's modelled collective seconds per sample) of
    :func:`psgd.plan.grid.choose_grid` on the run's layers and network, T dividing --servers
    under a parameter server. Every rank computes the same choice, no message sent."""
    from psgd.data.reader import dataset_info
    from psgd.nn.model import model_layers
    from psgd.plan import grid
    from psgd.run.grid_cost import NO_NETWORK_FLAGS, pricer
    info, n_servers = dataset_info(s.data), servers_of(s)
    layers = model_layers(s.model, s.seed, info["input_shape"], info["n_classes"])[0]
    parts = [t for t in range(1, world + 1) if n_servers % t == 0] if n_servers else None
    return grid.choose_grid(layers, world, s.batch_size, np.dtype(s.split.dtype).itemsize,
                            lambda d, t: pricer(network or NO_NETWORK_FLAGS, world, t, n_servers)[0], parts,
                            broadcast=shares_copies(s))


def _build(s, part, replica: int, n_replicas: int, axis: str, resumed, run_id: str, network) -> dict:
    """This rank's part of the model, drawn (or read from the checkpoint) without the whole."""
    from psgd.data.reader import ShardReader, dataset_info
    from psgd.tensor.conv import split_tensor
    from psgd.tensor.model import TensorModel
    from psgd.tensor.spatial import split_spatial
    info = dataset_info(s.data)
    choice: dict = {}
    split = {"spatial": split_spatial, "tensor": split_tensor}.get(axis) or _auto(s, choice, n_replicas, network)
    model = TensorModel(s.model, split, part, seed=s.seed,
                        dtype=np.dtype(s.split.dtype), input_shape=info["input_shape"], n_classes=info["n_classes"])
    reader = ShardReader(s.data, replica, n_replicas, s.batch_size, seed=s.seed)
    total = s.steps or max(1, int(round((s.epochs or 1.0) * reader.steps_per_epoch)))
    ckpt = resume_checkpoint(s, resumed, model, total, get(s.protocol), load=lambda path: _load(path, model))
    opt = None if servers_of(s) else make_optimizer(
        s.optimizer, model.n_params, momentum=s.momentum, weight_decay=s.weight_decay, dtype=model.dtype)
    if ckpt is not None and opt is not None:
        opt.load_state_dict(ckpt.opt_state)
    return {"model": model, "reader": reader, "total": total, "axis": axis, "auto": choice,
            "opt": opt, "start": ckpt.step if ckpt else 0, "run_id": run_id,
            "opt_state": ckpt.opt_state if ckpt is not None and opt is None else None,
            "foreign": check_checkpoint_dir(s, run_id)}


def _auto(s, choice: dict, n_replicas: int, network):
    """--grid auto's split: the head (batch or spatial) and cut of
    :func:`psgd.plan.grid.choose_split` priced on the run's network
    (:mod:`psgd.run.grid_cost`), kept in ``choice``."""
    from psgd.plan.grid import choose_split
    from psgd.run.grid_cost import NO_NETWORK_FLAGS, pricer
    from psgd.tensor.mixed import split_mixed

    def split(layers, comm):
        price, choice["network"] = pricer(network or NO_NETWORK_FLAGS, n_replicas * comm.Get_size(),
                                          comm.Get_size(), servers_of(s))
        choice["head"], choice["cut"], rows = choose_split(
            layers, comm, s.batch_size, np.dtype(s.split.dtype).itemsize, price, n_replicas,
            broadcast=shares_copies(s))
        choice["costs"] = {f"{r['head']} {r['cut']}": r["collective_s"] + r["compute_s"] for r in rows}
        choice["layers"] = [type(layer).__name__ for layer in layers]
        return split_mixed(layers, comm, choice["cut"], choice["head"])
    return split


def _load(path, model):
    """A checkpoint with this rank's part of its vectors: each rank reads its own rows."""
    def take(read, n: int):
        if n != model.n_total:
            raise UsageError(f"checkpoint {path} holds {n} parameters, model {model.spec} has {model.n_total}")
        return model.take_flat(read)
    return load_checkpoint(path, take=take)


def _train(comm, part, replicas, s, setup: dict) -> TensorJob:
    model, reader, total, worker = setup["model"], setup["reader"], setup["total"], setup.get("worker")
    lr = make_schedule(s.lr_schedule, s.lr, total, warmup=s.warmup, step_every=s.lr_step_every,
                       gamma=s.lr_gamma)
    log = MetricsLog(s.log if comm.Get_rank() == 0 else None, append=setup["start"] > 0)
    stop, times, step = np.zeros(1, np.int64), [], setup["start"]
    sums = np.zeros(3)
    if worker is not None:
        worker.start(model.params, step)
    if s.traces.timeline:   # one zero for every rank's clock
        wait.barrier(comm, "the other ranks to start the timeline")
        timeline.start()
    clock = setup["clock"] = LayerTimes(model)
    begin = time.perf_counter()
    while step < total:
        t0 = time.perf_counter()
        x, y = reader.batch(step)
        model.reseed(reader.worker, step)
        share_copies(part, model, setup.get("copies"))
        t1 = time.perf_counter()
        loss, correct = clock.measure(model.loss_and_grad, x, y)
        t2 = time.perf_counter()
        _update(setup, replicas, step, lr)
        times.append(time.perf_counter() - t0)
        _spans(step, t0, t1, t2, t0 + times[-1])
        sums += (loss, correct / len(y), 1)
        step += 1
        if step % s.log_every == 0 or step == total:
            _log_step(log, replicas, step, sums[:2] / sums[2])
            sums[:] = 0
        stop[0] = signals.received()
        wait.wait(comm.Iallreduce(MPI.IN_PLACE, stop, MPI.MAX), "the grid's stop check")
        if stop[0]:
            break
        if s.checkpoint_dir and s.checkpoint_every and step % s.checkpoint_every == 0 and step < total:
            _save(comm, replicas, s, setup, step)
    if worker is not None:
        worker.finish()
    if s.traces.timeline:
        _save_timeline(comm, s, time.perf_counter() - begin)
    setup["end"] = step
    saved = _save(comm, replicas, s, setup, step) if s.checkpoint_dir else None
    _finish(comm, part, replicas, s, setup, log, step, times)
    free_all()
    if stop[0] and comm.Get_rank() == 0:
        kept = f"checkpoint: {saved}" if saved else "no --checkpoint-dir, no checkpoint"
        print(f"psgd: stopped by {signals.signal_name(int(stop[0]))} at step {step} ({kept})", flush=True)
    return TensorJob(total_steps=total, end_step=step)


def shares_copies(s) -> bool:
    """asp/ssp under servers: the group takes part 0's copies before each step (:func:`copies`)."""
    return bool(servers_of(s)) and get(s.protocol).bound != 0.0


def copies(model) -> np.ndarray:
    """Local indices of the values every part of the group holds a copy of (its replicated
    and partial rows: the layers on samples, a row-parallel layer's bias)."""
    return np.concatenate([np.zeros(0, np.int64)] + [
        p.start + np.flatnonzero(np.repeat(p.kinds != 0, p.width)) for p in model.pieces])


def share_copies(part, model, index) -> None:
    """asp/ssp: each part's servers step their copies (the layers on samples, a row layer's
    bias) in their own order, so before each step the group takes part 0's (its servers'
    values are the run's, as a checkpoint's are) and the copies stay one model."""
    if index is not None and index.size and part.Get_size() > 1:
        values = np.ascontiguousarray(model.params[index])
        wait.wait(part.Ibcast(values, root=0), "part 0 to share the layers on samples")
        model.params[index] = values


def _save(comm, replicas, s, setup: dict, step: int):
    """Gather the parts' parameters and optimizer state of replica 0 (every replica holds the
    same; under servers, each part's servers send theirs to replica 0) into serial flat
    vectors on rank 0, which writes them as one checkpoint and returns its path."""
    model, groups = setup["model"], setup.get("groups")
    if replicas.Get_rank() != 0:
        return None
    if groups is not None:
        at, params, state = groups.receive_state(final=step == setup.get("end"))
        if at not in (step, -1):
            raise AssertionError(f"the part's servers sent the state of step {at}, not {step}")
    else:
        params, state = model.params, setup["opt"].state_dict()
    params = model.gather_flat(params)
    state = {k: model.gather_flat(v) if np.ndim(v) else v for k, v in state.items()}
    if comm.Get_rank() != 0:
        return None
    return save_checkpoint(s.checkpoint_dir, Checkpoint(
        params=params.astype(np.float32), model_spec=s.model, step=step, optimizer=s.optimizer,
        opt_state=state, clocks=np.full(comm.Get_size() // model.comm.Get_size(), step, np.int64),
        protocol=s.protocol, seed=s.seed, config=s.as_dict(), run_id=setup["run_id"]),
        keep=s.checkpoint_keep)


def _spans(step: int, *edges: float) -> None:
    """--timeline: the step's data, compute (the split forward and backward, its collectives
    in the detail row) and step (averaging over the replicas, the optimizer) spans."""
    if timeline.current is not None:
        for kind, t0, t1 in zip(("data", "compute", "step"), edges, edges[1:]):
            timeline.current.span(kind, t0, t1, clock=step)


def _save_timeline(comm, s, wall: float) -> None:
    """Every grid rank's spans (the servers' not) to rank 0 of ``comm``, which writes the trace."""
    from psgd.run.trace import save_timeline
    timeline.current.wall = wall
    roles = SimpleNamespace(comm=comm, rank=comm.Get_rank(), lead_worker=0, n_servers=0)
    save_timeline(SimpleNamespace(roles=roles, settings=s))


def _update(setup: dict, replicas, step: int, lr) -> None:
    """Average the gradient over the replicas and step this part: by all-reduce and the local
    optimizer, or through the part's parameter servers (which pull the next parameters)."""
    model, worker = setup["model"], setup.get("worker")
    if worker is not None:
        grad = model.grad
        if worker.grad_buffer is not None:
            worker.grad_buffer[:] = grad
            grad = worker.grad_buffer
        worker.step(model.params, grad, step)
        return
    if replicas.Get_size() > 1:
        allreduce(replicas, model.grad, label="tensor grid gradients")
        np.divide(model.grad, replicas.Get_size(), out=model.grad)
    setup["opt"].step(model.params, model.grad, lr(step))


def _log_step(log, replicas, step: int, mean: np.ndarray) -> None:
    mean = mean.copy()
    allreduce(replicas, mean, label="tensor grid loss")
    mean /= replicas.Get_size()
    log.write("step", step=step, loss=float(mean[0]), train_acc=float(mean[1]))


def _finish(comm, part, replicas, s, setup: dict, log, step: int, times: list) -> None:
    """Evaluate the model through replica 0's parts and report time and memory per rank."""
    model, reader = setup["model"], setup["reader"]
    held = activation_bytes(model)   # the training step's buffers, before evaluation's
    if replicas.Get_rank() == 0:
        model.set_calibration(reader.calibration_rows(512)[0])
        x, y = reader.test_set()
        if s.eval_samples:
            x, y = x[:s.eval_samples], y[:s.eval_samples]
        loss, acc = model.evaluate(x, y)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB
    mine = np.array([model.param_bytes(), rss, model.grad.nbytes, held], np.int64)
    every = np.zeros((comm.Get_size(), 4), np.int64)
    wait.wait(comm.Iallgather(mine, every), "the grid's memory report")
    if comm.Get_rank() != 0:
        return
    ms = 1e3 * float(np.median(times[1:] or times))
    d, t, most = comm.Get_size() // part.Get_size(), part.Get_size(), int(every[:, 0].max())
    whole = model.n_total * model.dtype.itemsize
    _say_auto(setup["auto"], setup["grids"])
    log.write("summary", steps=step, test_loss=loss, test_accuracy=acc, grid=[d, t], axis=setup["axis"],
              auto_cut=setup["auto"].get("cut"), auto_head=setup["auto"].get("head"),
              auto_network=setup["auto"].get("network"),
              auto_grids=setup["grids"] or None,
              step_ms=ms, param_bytes_per_rank=most, param_bytes_serial=whole,
              peak_rss_bytes=every[:, 1].tolist(), param_bytes=every[:, 0].tolist(),
              grad_bytes=every[:, 2].tolist(), activation_bytes=every[:, 3].tolist(),
              layer_ms=setup["clock"].report())
    log.close()
    print(f"psgd: {setup['axis']} grid D={d} x T={t}: {step} steps, test loss {loss:.4f}, "
          f"accuracy {acc:.4f}; median step {ms:.2f} ms; parameters {most} bytes per rank "
          f"(whole model {whole}); peak RSS MiB per rank {(every[:, 1] >> 20).tolist()}", flush=True)


def _say_auto(auto: dict, grids: dict) -> None:
    """--grid auto: which layers ran on the samples (or rows) and which were split, each
    split's modelled seconds, and (plain auto) each grid's per sample."""
    if grids:
        print(f"psgd: --grid auto: modelled seconds per sample of each DxT grid "
              f"{ {k: float(f'{v:.4g}') for k, v in grids.items()} }", flush=True)
    if auto:
        cut, where = auto["cut"], "samples" if auto["head"] == "batch" else "rows of every image"
        costs = {k: round(v, 6) for k, v in auto["costs"].items()}
        print(f"psgd: --grid auto: layers {auto['layers'][:cut]} on each rank's {where}, "
              f"{auto['layers'][cut:]} split by tensor ({auto['head']} cut {cut}; modelled "
              f"collective + compute seconds per head and cut {costs}, on {auto['network']})", flush=True)
