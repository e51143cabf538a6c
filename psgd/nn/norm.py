"""Batch normalisation over the channel (last) axis; its evaluation statistics are state, not parameters."""
# Statistics: a training forward pass normalises with the batch's own mean and variance.
# Evaluation uses population statistics that Model.calibrate recomputes from a fixed set
# of training samples with the current parameters (precise BN), never a running average
# over steps: under asynchronous protocols consecutive steps see different parameter
# versions, and a recomputed statistic is a function of the parameters alone, so a
# resumed run evaluates exactly as the uninterrupted one without storing any state.
from __future__ import annotations

import numpy as np

from psgd.kernels.batchnorm import (batchnorm_backward, batchnorm_forward_eval,
                                    batchnorm_forward_train)
from psgd.nn.layers import Layer

CALIBRATION_BLOCK_BYTES = 1 << 20     # float64 rows a calibration pass converts at a time


def batch_sums(x2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float64 sums of the rows of ``x2`` (rows, C) and of their squares, a block of rows at
    a time: the same additions, row after row, as over the whole batch converted at once,
    without its two float64 copies."""
    rows = max(1, CALIBRATION_BLOCK_BYTES // (8 * x2.shape[1]))
    s, q = np.zeros(x2.shape[1]), np.zeros(x2.shape[1])
    for a in range(0, x2.shape[0], rows):
        block = x2[a:a + rows].astype(np.float64)
        s = np.add.reduce(np.vstack([s[None], block]), axis=0)
        q = np.add.reduce(np.vstack([q[None], block * block]), axis=0)
    return s, q


class BatchNorm(Layer):
    """``gamma * (x - mean) / sqrt(var + eps) + beta`` per channel; any per-sample shape (..., C).

    With ``relu=True`` the layer is batch norm then ReLU in one pass over memory each way
    (the spec builder makes ``bn-relu`` so).

    Parameters ``gamma`` (init 1) and ``beta`` (init 0), (C,) each.  ``mean`` and ``var``,
    float64 (C,), are the evaluation statistics (0 and 1 until calibrated): in ``"calibrate"``
    mode every forward pass adds its input to running sums, and :meth:`end_calibration`
    turns them into the mean and (biased) variance over all samples and pixels seen.
    """

    def __init__(self, shape: tuple, eps: float = 1e-5, relu: bool = False) -> None:
        super().__init__()
        self.in_shape = self.out_shape = tuple(shape)
        self.eps = float(eps)
        self.relu = bool(relu)
        c = self.in_shape[-1]
        self.mean, self.var = np.zeros(c), np.ones(c)
        self._sum, self._sumsq, self._count = np.zeros(c), np.zeros(c), 0

    def param_shapes(self):
        return [("gamma", (self.in_shape[-1],)), ("beta", (self.in_shape[-1],))]

    def bind(self, params, grads):
        self.gamma, self.beta = params["gamma"], params["beta"]
        self.dgamma, self.dbeta = grads["gamma"], grads["beta"]

    def init_params(self, rng):
        self.gamma[...] = 1.0
        self.beta[...] = 0.0

    def begin_calibration(self) -> None:
        self._sum[:], self._sumsq[:], self._count = 0.0, 0.0, 0

    def end_calibration(self) -> None:
        if self._count:
            self.mean[:] = self._sum / self._count
            self.var[:] = np.maximum(self._sumsq / self._count - self.mean ** 2, 0.0)

    def forward(self, x):
        c = self.in_shape[-1]
        x2 = np.ascontiguousarray(x).reshape(-1, c)
        out = self._buf("out", x.shape, x.dtype)
        o2 = out.reshape(-1, c)
        if self.mode == "eval":
            batchnorm_forward_eval(x2, self.gamma, self.beta, self.mean, self.var, self.eps, self.relu, o2)
            return out
        if self.mode == "calibrate":
            s, q = batch_sums(x2)
            self._sum += s
            self._sumsq += q
            self._count += x2.shape[0]
        self._x2, self._o2 = x2, o2
        self._mean = self._buf("mean", (c,), np.float64)
        self._invstd = self._buf("invstd", (c,), np.float64)
        batchnorm_forward_train(x2, self.gamma, self.beta, self.eps, self.relu, o2, self._mean,
                                self._invstd)
        return out

    def backward(self, dy, need_dx=True):
        c = self.in_shape[-1]
        dx = self._buf("dx", dy.shape, dy.dtype)
        batchnorm_backward(np.ascontiguousarray(dy).reshape(-1, c), self._x2, self._mean, self._invstd,
                           self.gamma, self._o2, self.relu, dx.reshape(-1, c), self.dgamma, self.dbeta)
        return dx if need_dx else None

    def __repr__(self) -> str:
        return f"BatchNorm{'+ReLU' if self.relu else ''}({self.in_shape} -> {self.out_shape})"
