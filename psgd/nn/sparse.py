"""Linear models on CSR batches: ``linear`` (multinomial logistic regression) and ``svm`` (multiclass hinge).

The flat vector is ``w`` (D, K) row-major followed by ``b`` (K,): a (D + 1, K) matrix
whose row D is the bias, so a batch touches the rows of its features and row D.
The numba kernels are imported where a model computes, so a rank that only holds
the parameters (a hogwild server) never loads numba.
"""
from __future__ import annotations

import functools
import re

import numpy as np

from psgd.nn.flat import FlatParams

KINDS = ("linear", "svm")
SPEC_HELP = "expected 'linear' or 'svm' (sizes from the data) or 'linear:D-K' / 'svm:D-K'"


@functools.cache
def _kernels():
    """The numba kernels (loss, sparse), imported once, at the first computation."""
    from psgd.kernels import loss, sparse
    return loss, sparse


def is_sparse_spec(spec) -> bool:
    """Whether ``spec`` names a model of this module."""
    return isinstance(spec, str) and spec.strip().lower().split(":")[0] in KINDS


def check_data_kind(spec: str, sparse_model: bool, sparse_data: bool, data: str) -> None:
    """Raise ValueError when a dense model meets sparse data or the reverse."""
    if sparse_model and not sparse_data:
        raise ValueError(f"model {spec} takes sparse (CSR) data, but {data} is dense; make one with "
                         f"'psgd data synth --sparse' or 'psgd data convert --svmlight'")
    if sparse_data and not sparse_model:
        raise ValueError(f"{data} is sparse (CSR), but model {spec} takes dense inputs; use "
                         f"--model linear or --model svm")


class SparseLinear(FlatParams):
    """A linear model over CSR input with the contract of :class:`psgd.nn.model.Model`.

    Attributes
    ----------
    params, grad : (n_params,) float32, ``n_params = (D + 1) * K``
    touched : (m,) int64
        Rows of the (D + 1, K) matrix the last batch touched (its features and the bias row D).
    row_len : int
        K, the length of one row.
    """

    sparse = True
    stochastic = False   # no dropout

    def __init__(self, kind: str, n_features: int, n_classes: int, spec: str, dtype=np.float32) -> None:
        self.kind, self.spec = kind, spec
        self.n_features, self.n_classes = int(n_features), int(n_classes)
        self.input_shape = (self.n_features,)
        self.row_len = self.n_classes
        self.dtype = np.dtype(dtype)
        self.n_params = (self.n_features + 1) * self.n_classes
        self._params = np.zeros(self.n_params, self.dtype)
        self._grad = np.zeros(self.n_params, self.dtype)
        self._mark = np.zeros(self.n_features + 1, np.bool_)
        self.touched = np.zeros(0, np.int64)

    def set_calibration(self, x) -> None:
        """No effect: a linear model has no batch norm."""

    def use_grad_buffer(self, buf: np.ndarray | None) -> None:
        """Compute gradients into ``buf`` from now on (None: a fresh buffer); zeroed here."""
        buf = self._grad_buffer(buf)
        buf[:] = 0
        self._grad = buf
        self.touched = np.zeros(0, np.int64)

    def _matrices(self, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        m = v.reshape(self.n_features + 1, self.n_classes)
        return m[:-1], m[-1]

    def check_batch(self, x, y) -> tuple:
        """Validate a CSR batch and its labels; return (x, y int64)."""
        from psgd.data.csr import CSRBatch
        if not isinstance(x, CSRBatch):
            raise ValueError(f"model {self.spec} takes sparse CSR batches, got {type(x).__name__} "
                             f"(a dense model on sparse data, or the reverse)")
        if x.n_features != self.n_features:
            raise ValueError(f"x has {x.n_features} features; model {self.spec} expects {self.n_features}")
        if len(x) == 0:
            raise ValueError("x is an empty batch (B = 0)")
        y = np.asarray(y)
        if y.shape != (len(x),) or y.dtype.kind not in "iu":
            raise ValueError(f"y must be ({len(x)},) integer class ids, got {y.dtype} {y.shape}")
        if y.min() < 0 or y.max() >= self.n_classes:
            raise ValueError(f"y holds labels outside [0, {self.n_classes})")
        return x, y.astype(np.int64)

    def _loss(self, scores: np.ndarray, y: np.ndarray, dscores: np.ndarray) -> tuple:
        loss, sparse = _kernels()
        fn = loss.softmax_cross_entropy if self.kind == "linear" else sparse.multiclass_hinge
        return fn(scores, y, dscores)

    def _scores(self, x) -> np.ndarray:
        w, b = self._matrices(self._params)
        out = np.empty((len(x), self.n_classes), self.dtype)
        _kernels()[1].csr_linear_forward(x.indptr, x.indices, x.values, w, b, out)
        return out

    def loss_and_grad(self, x, y) -> tuple[float, int]:
        """Forward and backward on one CSR batch; :attr:`grad` holds d(mean loss)/d(params)
        (zero outside :attr:`touched`)."""
        sparse = _kernels()[1]
        x, y = self.check_batch(x, y)
        scores = self._scores(x)
        dscores = np.empty_like(scores)
        loss, correct = self._loss(scores, y, dscores)
        g = self._grad.reshape(self.n_features + 1, self.n_classes)
        sparse.zero_rows(g, self.touched)
        gw, gb = self._matrices(self._grad)
        sparse.csr_linear_backward(x.indptr, x.indices, x.values, dscores, gw, gb)
        self.touched = self.rows_of(x)
        return float(loss), int(correct)

    def rows_of(self, x) -> np.ndarray:
        """The sorted int64 rows a CSR batch ``x`` touches: its features' and the bias row D."""
        rows = _kernels()[1].touched_rows(x.indices, self.n_features + 1, self._mark)
        return np.append(rows, self.n_features)

    def predict(self, x, batch_size: int = 4096) -> np.ndarray:
        """Class ids (B,) int64 of the arg-max score."""
        return np.concatenate([self._scores(x[s:s + batch_size]).argmax(axis=1)
                               for s in range(0, len(x), batch_size)])

    def evaluate(self, x, y, batch_size: int = 4096) -> tuple[float, float]:
        """Mean loss and accuracy over a whole CSR data set; parameters unchanged."""
        x, y = self.check_batch(x, y)
        total, correct = 0.0, 0
        for s in range(0, len(x), batch_size):
            scores = self._scores(x[s:s + batch_size])
            loss, c = self._loss(scores, y[s:s + batch_size], np.empty_like(scores))
            total += loss * len(scores)
            correct += c
        return total / len(x), correct / len(x)

    def __repr__(self) -> str:
        return f"SparseLinear({self.spec!r}, n_params={self.n_params})"


def build_sparse_model(spec: str, n_features: int, n_classes: int, dtype=np.float32) -> SparseLinear:
    """Build ``linear`` or ``svm`` (zero-initialised) for ``n_features`` inputs and ``n_classes`` classes.

    A spec with sizes (``linear:D-K``) must match them.
    """
    s = spec.strip().lower()
    m = re.fullmatch(r"(linear|svm)(?::(\d+)-(\d+))?", s)
    if not m:
        raise ValueError(f"malformed model spec {spec!r}; {SPEC_HELP}")
    if m.group(2) and (int(m.group(2)), int(m.group(3))) != (n_features, n_classes):
        raise ValueError(f"model {spec} takes {m.group(2)} features and {m.group(3)} classes, but the "
                         f"data has {n_features} and {n_classes}")
    if n_classes < 2:
        raise ValueError(f"model {spec} needs at least 2 classes, got {n_classes}")
    return SparseLinear(m.group(1), n_features, n_classes, spec.strip(), dtype)
