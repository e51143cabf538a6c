"""Sparse hogwild on a shared window, a run of steps in one compiled call.

For each step: read the update counter, copy the batch's rows from the shared shards and
catch them up on the weight decay they missed, forward and backward of the linear model
(``linear`` or ``svm``), the SGD (or AdaGrad) step, then a CPU-atomic fetch-and-add of the counter
(staleness = its value minus the value read) and CPU-atomic adds of the change into the
shards. With ``--hold-hot`` the hot rows' changes (:mod:`psgd.hogwild.hot`) and the counter's
are added every ``hold`` steps instead. The arithmetic is that of the step-by-step path (:mod:`psgd.nn.sparse`,
:mod:`psgd.nn.lazy_decay`, :mod:`psgd.hogwild.sparse`), in the same order.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from psgd.errors import PsgdError
from psgd.hogwild.hot import add_or_hold, read_held, read_rows, settle, step_held
from psgd.hogwild.sparse import INDEX_BYTES
from psgd.kernels.atomic import atomic_add, atomic_load
from psgd.kernels.loss import softmax_cross_entropy
from psgd.kernels.sparse import (csr_linear_backward, csr_linear_forward, multiclass_hinge,
                                 zero_rows)
from psgd.nn.lazy_adagrad import adagrad_rows_step
from psgd.nn.lazy_decay import decay_rows, sparse_step

OK, BAD_LOSS, BAD_GRAD, BAD_UPDATE = 0, 1, 2, 3   # status of a run (which check failed)


@njit(cache=True)
def _finite_rows(a, rows):
    bad = False
    for r in rows:
        for c in range(a.shape[1]):
            x = a[r, c]
            bad |= x - x != 0
    return not bad


@njit(cache=True)
def _touched(indptr, indices, batch_rows, bias, mark, out):
    """The distinct features of the batch's rows in first-seen order, then ``bias``, into
    ``out``; their count. ``mark`` (bool scratch) is left all False."""
    m = 0
    for r in batch_rows:
        for p in range(indptr[r], indptr[r + 1]):
            f = indices[p]
            if not mark[f]:
                mark[f] = True
                out[m] = f
                m += 1
    for j in range(m):
        mark[out[j]] = False
    out[m] = bias
    return m + 1


@njit(cache=True)
def _loss_and_grad(indptr, indices, values, w, g, prev, batch_rows, labels, hinge, scores,
                   dscores):
    """The batch's loss and correct count; ``g`` (its rows ``prev`` zeroed first) its gradient."""
    d = w.shape[0] - 1   # the bias row
    csr_linear_forward(indptr, indices, values, w[:d], w[d], scores, batch_rows)
    if hinge:
        loss, correct = multiclass_hinge(scores, labels, dscores)
    else:
        loss, correct = softmax_cross_entropy(scores, labels, dscores)
    zero_rows(g, prev)
    csr_linear_backward(indptr, indices, values, dscores, g[:d], g[d], batch_rows)
    return loss, correct


@njit(cache=True)
def _push(shards, bounds, count, w, touched, k, change, caught, lam, slot, held, seen, counted):
    """Push a finite step's ``change`` with the rows' decay catch-up (``caught``): held rows take
    it in ``w`` and ``held``, the others are added. Returns (rows added, staleness: the counter
    now minus ``seen``, or 0 when not ``counted`` here but by :func:`psgd.hogwild.hot.settle`)."""
    n = touched.size
    step_held(w, touched, slot, change)
    if lam != 0.0:
        change[:n] += caught[:n]
    stale = atomic_add(count, 0, np.int64(1)) - seen if counted else 0
    return add_or_hold(shards, bounds, touched, k, change[:n].ravel(), slot, held), stale


@njit(cache=True)
def _update(w, g, touched, last, logs, t, lr, lam, change, acc, eps, scratch):
    """Step ``t`` on the ``touched`` rows into ``change``: LazyDecaySGD's (and its ``logs`` entry),
    or with ``acc`` LazyAdagrad's; whether the step is finite."""
    if acc is None:
        finite = sparse_step(w, g, touched, last, logs, t, lr, lam, change)
        logs[t + 1] = logs[t] + np.log1p(-lr * lam)
        return finite
    return adagrad_rows_step(w, g, acc, touched, lr, eps, change, scratch, False)


@njit(cache=True)
def sparse_steps(shards, bounds, count, params, grad, prev, indptr, indices, values, y, rows,
                 batch, lrs, hinge, last, logs, t, lam, check, skip_nonfinite, losses, corrects,
                 staleness, slot, hot, hold, acc=None, eps=0.0):
    """Run ``len(lrs)`` hogwild steps; step i takes the rows ``rows[i*batch:(i+1)*batch]`` of the
    worker's CSR slice (``indptr``, ``indices``, ``values``, labels ``y``) at learning rate ``lrs[i]``.

    ``params``, ``grad``: the worker's (D + 1) * K vectors (``grad`` non-zero only on the rows
    ``prev``, as :class:`psgd.nn.sparse.SparseLinear` leaves it); ``last``, ``logs``, ``t``, ``lam``:
    the :class:`psgd.nn.lazy_decay.LazyDecaySGD` state (``logs`` long enough for ``t + len(lrs)``);
    ``check``: stop on a non-finite loss or gradient; ``skip_nonfinite``: drop a non-finite update
    (else stop); ``slot``, ``hot``, ``hold``: :mod:`psgd.hogwild.hot`'s held rows. Fills ``losses``,
    ``corrects`` and ``staleness`` (-1: dropped) per step; returns (steps done, status, dropped,
    rows read, rows pushed, the last step's touched rows, sorted). With ``acc`` ((n_rows, k)
    float32, :class:`psgd.nn.lazy_adagrad.LazyAdagrad`'s) the step is AdaGrad's (``eps``), not
    SGD's (``lam`` is then 0).
    """
    n_rows, k, d = last.size, bounds[-1] // last.size, last.size - 1   # d: the bias row
    w, g = params.reshape(n_rows, k), grad.reshape(n_rows, k)
    scores, dscores = np.empty((batch, k), params.dtype), np.empty((batch, k), params.dtype)
    all_labels, mark = y[rows], np.zeros(n_rows, np.bool_)
    change, held = np.empty((n_rows, k), params.dtype), np.zeros((hot.size, k), params.dtype)
    caught = np.empty((n_rows if lam != 0.0 else 0, k), params.dtype)   # decay catch-ups
    buffers = np.empty((2, n_rows), np.int64)
    scratch = np.empty((2, n_rows if acc is not None else 0, k), np.float32)
    touched, dropped, pushed, done, status = prev, 0, 0, lrs.size, OK
    read, first, base = read_held(params, shards, bounds, hot[:hot.size if lrs.size else 0], k), 0, \
        atomic_load(count, 0)
    for step in range(lrs.size):
        lo, hi = step * batch, (step + 1) * batch
        batch_rows, labels = rows[lo:hi], all_labels[lo:hi]
        prev = touched
        touched = buffers[step % 2, :_touched(indptr, indices, batch_rows, d, mark, buffers[step % 2])]
        seen = atomic_load(count, 0) if hot.size == 0 else 0   # read: the counter, then the rows
        read += read_rows(params, shards, bounds, touched, k, slot)
        if lam != 0.0:   # the rows' missed decay first, so the gradient is taken at decayed rows
            decay_rows(w, touched, last, logs, t + step, caught)
        loss, correct = _loss_and_grad(indptr, indices, values, w, g, prev, batch_rows, labels,
                                       hinge, scores, dscores)
        losses[step], corrects[step] = loss, correct
        if check and not (np.isfinite(loss) and _finite_rows(g, touched)):
            done, status = step, BAD_LOSS if not np.isfinite(loss) else BAD_GRAD
            break
        if not _update(w, g, touched, last, logs, t + step, lrs[step], lam, change, acc, eps, scratch):
            if not skip_nonfinite:
                done, status = step, BAD_UPDATE
                break
            dropped += 1
            if lam != 0.0:   # the catch-up before the batch still counts
                pushed += add_or_hold(shards, bounds, touched, k, caught[:touched.size].ravel(), slot, held)
        else:
            added, staleness[step] = _push(shards, bounds, count, w, touched, k, change, caught, lam,
                                           slot, held, seen, hot.size == 0)
            pushed += added
        if hot.size and ((step + 1) % hold == 0 or step + 1 == lrs.size):
            base = settle(shards, bounds, hot, k, held, params, count, staleness, first, step + 1, base)
            first, pushed, read = step + 1, pushed + hot.size, read + hot.size
    if hot.size and first < done:   # stopped early: the held changes still land
        settle(shards, bounds, hot, k, held, params, count, staleness, first, done, base)
        pushed += hot.size
    return done, status, dropped, read, pushed, np.sort(touched)


def run(worker, params: np.ndarray, x, y: np.ndarray, rows: np.ndarray, clock: int,
        lrs: np.ndarray) -> tuple:
    """:func:`sparse_steps` for a :class:`psgd.hogwild.worker.HogwildWorker` of a sparse model on
    a shared window: its model's ``grad``, ``touched`` and lazy-decay (or AdaGrad) state, its counts, bytes
    and staleness histogram follow as after as many steps one by one.

    Returns (losses, corrects, steps done, status); raises at a non-finite update (unless
    ``--skip-nonfinite``), as the step would.
    """
    updates, windows, stats = worker._sparse, worker.windows, worker.stats
    model, sgd, n = updates.model, updates.lazy, lrs.size
    sgd.reserve(n, float(lrs.max()) if n else 0.0)
    losses, corrects = np.zeros(n, np.float64), np.zeros(n, np.int64)
    staleness = np.full(n, -1, np.int64)
    skip = worker.config.skip_nonfinite
    done, status, dropped, read, pushed, model.touched = sparse_steps(
        tuple(windows.shards), updates.bounds, windows.count, params, model.grad, model.touched,
        x.indptr, x.indices, x.values, y, rows, len(rows) // max(n, 1), lrs, model.kind == "svm",
        sgd.last, sgd.logs, sgd.t, sgd.weight_decay, not skip, skip, losses, corrects, staleness,
        *updates.held(x, len(rows) // max(n, 1)), sgd.acc if updates.adagrad else None,
        sgd.eps if updates.adagrad else 0.0)
    sgd.t += done + (status == BAD_UPDATE)   # that step's decay was taken
    ok = staleness[:done][staleness[:done] >= 0]
    worker.histogram.merge(np.bincount(ok))
    stats["n_updates"] += int(ok.size)
    stats["skipped"] += dropped
    per_row = updates.row_len * (4 + INDEX_BYTES)
    stats["pull_bytes"] += read * per_row
    stats["push_bytes"] += pushed * per_row
    if status == BAD_UPDATE:
        raise PsgdError(f"hogwild worker {worker.roles.worker_index}: the update at clock "
                        f"{clock + done} holds NaN or Inf (use --skip-nonfinite to drop such updates)")
    return losses, corrects, done, status
