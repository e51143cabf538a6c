"""Single-process training on in-memory arrays: the reference loop the MPI protocols are compared with."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from psgd.nn.model import CALIBRATION_SAMPLES, Model
from psgd.nn.optim import Optimizer, make_optimizer


def train_serial(model: Model, x, y, *, optimizer: str | Optimizer = "sgd",
                 lr: float | Callable[[int], float] = 0.05, batch_size: int = 64,
                 epochs: int = 1, seed: int = 0, x_test=None, y_test=None,
                 log: Callable | None = print) -> dict:
    """Train ``model`` in place with mini-batch steps over shuffled epochs of ``(x, y)``.

    Parameters
    ----------
    model : Model
    x : (N, *model.input_shape) float32; y : (N,) integer class ids
    optimizer : str or Optimizer
        A name for :func:`psgd.nn.optim.make_optimizer` (``'sgd'``, ``'momentum'``,
        ``'nesterov'``, ``'adam'``) or an optimizer already made for ``model.n_params``.
    lr : float or callable
        Learning rate, or a schedule ``lr(step)`` of the 0-based global step.
    batch_size, epochs, seed : int
        Each epoch visits every sample once in an order drawn from ``seed`` (the last
        batch may be smaller).
    x_test, y_test : optional held-out arrays, evaluated after every epoch.
    log : callable or None
        Called with one line per epoch (``print`` by default); None for silence.

    Returns
    -------
    dict
        ``{"epochs": [{"epoch", "train_loss", "train_acc", "test_loss", "test_acc",
        "seconds", "samples_per_s"}, ...], "steps": int, "final": <last epoch record>}``;
        train_loss/train_acc are running means over the epoch's batches (before each
        step), test_* are None without a test set.

    Raises
    ------
    ValueError
        Bad hyper-parameters, or data the model rejects.
    """
    if batch_size < 1 or epochs < 0:
        raise ValueError(f"batch_size must be >= 1 and epochs >= 0, got {batch_size} and {epochs}")
    x, y = model.check_batch(x, y)
    if (x_test is None) != (y_test is None):
        raise ValueError("give both x_test and y_test, or neither")
    opt = make_optimizer(optimizer, model.n_params) if isinstance(optimizer, str) else optimizer
    schedule = lr if callable(lr) else (lambda step, _lr=float(lr): _lr)
    rng = np.random.default_rng(seed)
    model.set_calibration(x[:CALIBRATION_SAMPLES])   # batch-norm statistics for evaluation
    history, step = [], 0
    for epoch in range(1, epochs + 1):
        rec, step = _epoch(model, opt, schedule, x, y, rng.permutation(x.shape[0]), batch_size,
                           epoch, step)
        if x_test is not None:
            rec["test_loss"], rec["test_acc"] = model.evaluate(x_test, y_test)
        history.append(rec)
        if log is not None:
            log(_describe(rec, epochs))
    return {"epochs": history, "steps": step, "final": history[-1] if history else None}


def _epoch(model, opt, schedule, x, y, order, batch_size, epoch, step) -> tuple[dict, int]:
    """One pass over ``x[order]`` in batches; returns the epoch's record and the next step."""
    t0 = time.perf_counter()
    n, loss_sum, correct = x.shape[0], 0.0, 0
    for s in range(0, n, batch_size):
        idx = order[s:s + batch_size]
        model.reseed(0, step)
        loss, c = model.loss_and_grad(x[idx], y[idx])
        if not np.isfinite(loss):
            raise ValueError(f"training diverged: loss {loss} at epoch {epoch}, step {step}; "
                             f"try a smaller learning rate")
        opt.step(model.params, model.grad, schedule(step))
        loss_sum += loss * len(idx)
        correct += c
        step += 1
    seconds = time.perf_counter() - t0
    return {"epoch": epoch, "train_loss": loss_sum / n, "train_acc": correct / n,
            "test_loss": None, "test_acc": None, "seconds": seconds,
            "samples_per_s": n / seconds if seconds > 0 else float("inf")}, step


def _describe(rec: dict, epochs: int) -> str:
    test = (f"  test loss {rec['test_loss']:.4f} acc {rec['test_acc']:.4f}"
            if rec["test_loss"] is not None else "")
    return (f"epoch {rec['epoch']}/{epochs}  train loss {rec['train_loss']:.4f} "
            f"acc {rec['train_acc']:.4f}{test}  ({rec['seconds']:.2f} s, "
            f"{rec['samples_per_s']:.0f} samples/s)")
