"""Models built from a spec string, owning one flat parameter vector and one flat gradient vector."""
from __future__ import annotations

import math
import re

import numpy as np

from psgd.kernels.finite import finite
from psgd.kernels.loss import labels_in_range, softmax_cross_entropy
from psgd.nn.elementwise import Dropout
from psgd.nn.flat import FlatParams
from psgd.nn.layers import Dense, Layer
from psgd.nn.norm import BatchNorm
from psgd.nn.spec import PRESETS, TOKEN_HELP, build_layers, expand_preset

SPEC_HELP = ("expected 'mlp:N0-N1-...-NK' (at least two positive sizes, e.g. 'mlp:784-256-256-10'), "
             f"a preset ({', '.join(PRESETS)}) or layer tokens joined by '-': {TOKEN_HELP}")
CALIBRATION_BATCH = 64
CALIBRATION_SAMPLES = 512   # training rows whose batch-norm statistics evaluation uses


class Model(FlatParams):
    """A feed-forward network whose parameters live in one contiguous vector.

    Attributes
    ----------
    spec : str
        The spec it was built from (e.g. ``'mlp:784-256-256-10'``, ``'lenet'``,
        ``'conv:16x3:pad1-bn-relu-gap-dense:10'``).
    params : (n_params,) float32
        All weights and biases; every layer's arrays are views into it.  Assigning
        ``model.params = v`` copies ``v`` in (the vector itself is never replaced).
    grad : (n_params,) float32
        Same layout; overwritten by :meth:`loss_and_grad`.
    n_params : int
    input_shape : tuple of int
        Per-sample input shape: ``(N0,)`` for an mlp, ``(1, 28, 28)`` (NCHW) for lenet.
        An mlp also takes any per-sample shape with N0 values (e.g. (B, 1, 28, 28)) and
        flattens it; lenet also takes (B, 28, 28) and flat rows (B, 784).
    n_classes : int
    layers : list of :class:`psgd.nn.layers.Layer`
    param_ranges : list of (layer index, name, start, stop)
        Where each layer's parameter array lies in the flat vectors.
    batchnorms : list of :class:`psgd.nn.norm.BatchNorm`
        Every batch-norm layer (inside residual blocks too); their evaluation statistics
        are recomputed from :meth:`set_calibration`'s samples by every :meth:`evaluate`
        and :meth:`predict` (see :mod:`psgd.nn.norm`).
    stochastic : bool
        True when the model has dropout: :meth:`reseed` then picks its masks.
    """

    def __init__(self, spec: str, layers: list[Layer], input_shape: tuple, n_classes: int,
                 seed: int = 0, dtype=np.float32) -> None:
        self.spec = spec
        self.seed = int(seed)
        self.layers = layers
        self.input_shape = tuple(input_shape)
        self.n_classes = int(n_classes)
        self.dtype = np.dtype(dtype)
        self._n_features = int(np.prod(self.input_shape))
        shapes = [(layer, name, tuple(shape)) for layer in layers for name, shape in layer.param_shapes()]
        self.n_params = int(sum(int(np.prod(s)) for _, _, s in shapes))
        self._params = np.zeros(self.n_params, self.dtype)
        self._grad = np.zeros(self.n_params, self.dtype)
        self.param_ranges: list[tuple[int, str, int, int]] = []
        offset = 0
        for layer_index, layer in enumerate(layers):
            for name, shape in layer.param_shapes():
                size = int(np.prod(shape))
                self.param_ranges.append((layer_index, name, offset, offset + size))
                offset += size
        self._bind()
        #: layers up to this one need no input gradient (nothing before them has parameters)
        self._first_param_layer = min((i for i, l in enumerate(layers) if l.param_shapes()), default=0)
        rng = np.random.default_rng(seed)
        for layer in layers:
            layer.init_params(rng)
        self._dlogits: np.ndarray | None = None
        self.batchnorms = [p for p in _walk(layers) if isinstance(p, BatchNorm)]
        self.stochastic = any(isinstance(p, Dropout) for p in _walk(layers))
        self._calibration: np.ndarray | None = None

    # -- modes, masks and statistics -------------------------------------------------------
    def _set_mode(self, mode: str) -> None:
        for layer in self.layers:
            layer.set_mode(mode)

    def reseed(self, *key: int) -> None:
        """Seed the dropout masks of the following training steps from ``(seed, layer, *key)``.

        Workers call it with (worker index, step) before each step, so masks differ between
        workers and a resumed run draws the masks the uninterrupted one drew.
        """
        for i, layer in enumerate(self.layers):
            if isinstance(layer, Dropout):
                index = i if layer.mask_index is None else layer.mask_index
                layer.reseed([self.seed, index, *map(int, key)])

    def set_calibration(self, x) -> None:
        """The training samples (N, *input_shape) that batch-norm statistics are computed from.

        No effect on a model without batch norm.  :meth:`evaluate` and :meth:`predict`
        run them through the model (batch statistics, no dropout) and use the population
        mean and variance each batch-norm layer saw.
        """
        if self.batchnorms:
            self._calibration = self._check_x(x).copy()

    def calibrate(self) -> None:
        """Recompute every batch-norm layer's evaluation statistics with the current parameters."""
        if not self.batchnorms:
            return
        if self._calibration is None:
            raise ValueError(f"model {self.spec!r} has batch norm: give it training samples with "
                             f"set_calibration(x) before evaluating")
        self._set_mode("calibrate")
        for bn in self.batchnorms:
            bn.begin_calibration()
        x = self._calibration
        for s in range(0, x.shape[0], CALIBRATION_BATCH):
            self._forward(x[s:s + CALIBRATION_BATCH])
        for bn in self.batchnorms:
            bn.end_calibration()

    def use_grad_buffer(self, buf: np.ndarray | None) -> None:
        """Compute gradients into ``buf`` from now on (None: a fresh buffer of the model's own).

        ``buf`` must be a contiguous (n_params,) array of the model's dtype, e.g.
        a parameter-server worker's :attr:`psgd.ps.worker.PSWorker.grad_buffer`,
        which the servers of its node read in place.  Its values are not kept.
        """
        self._grad = self._grad_buffer(buf)
        self._bind()

    def _bind(self) -> None:
        """Give every layer its views into the flat parameter and gradient vectors."""
        views: dict[int, tuple[dict, dict]] = {i: ({}, {}) for i in range(len(self.layers))}
        shapes = {(i, name): shape for i, layer in enumerate(self.layers)
                  for name, shape in layer.param_shapes()}
        for i, name, lo, hi in self.param_ranges:
            pv, gv = views[i]
            pv[name] = self._params[lo:hi].reshape(shapes[i, name])
            gv[name] = self._grad[lo:hi].reshape(shapes[i, name])
        for i, layer in enumerate(self.layers):
            layer.bind(*views[i])

    def __repr__(self) -> str:
        return f"Model({self.spec!r}, n_params={self.n_params})"

    # -- input checks ---------------------------------------------------------------------
    def _check_x(self, x) -> np.ndarray:
        """Validate a batch and return it as a C-contiguous array in the model dtype, (B, *input_shape)."""
        x = np.asarray(x)
        if x.dtype.kind not in "fiu":
            raise ValueError(f"x must hold real numbers, got dtype {x.dtype}")
        shape = tuple(x.shape[1:]) if x.ndim >= 2 else None
        if len(self.input_shape) == 1:  # an mlp flattens any per-sample shape of the right size
            ok = shape is not None and math.prod(shape) == self._n_features
            alt = f" or (B, ...) with {self._n_features} values per sample"
        else:  # images: (C, H, W), or (H, W) when C == 1, or flat rows
            accepted = {self.input_shape, (self._n_features,)}
            if self.input_shape[0] == 1:
                accepted.add(self.input_shape[1:])
            ok = shape in accepted
            alt = (f" or (B, {', '.join(map(str, self.input_shape[1:]))})" if self.input_shape[0] == 1 else "") \
                + f" or (B, {self._n_features})"
        if not ok:
            raise ValueError(f"x has shape {x.shape}; model {self.spec!r} expects "
                             f"(B, {', '.join(map(str, self.input_shape))}){alt}")
        if x.shape[0] == 0:
            raise ValueError("x is an empty batch (B = 0)")
        x = np.ascontiguousarray(x, dtype=self.dtype).reshape(x.shape[0], *self.input_shape)
        if not finite(x.reshape(-1)):
            raise ValueError("x contains non-finite values (NaN or inf)")
        return x

    def _check_y(self, y, n: int) -> np.ndarray:
        y = np.asarray(y)
        if y.ndim != 1 or y.shape[0] != n:
            raise ValueError(f"y has shape {y.shape}; expected ({n},) to match x's batch of {n}")
        if y.dtype.kind not in "iu":
            if y.dtype.kind == "f" and np.all(np.isfinite(y)) and np.all(y == np.round(y)):
                y = y.astype(np.int64)
            else:
                raise ValueError(f"y must hold integer class ids, got dtype {y.dtype}")
        y = np.ascontiguousarray(y, dtype=np.int64)
        if not labels_in_range(y, self.n_classes):
            raise ValueError(f"y holds labels outside [0, {self.n_classes}): "
                             f"min {int(y.min())}, max {int(y.max())}")
        return y

    def check_batch(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        """Validate a data set or batch; return ``x`` as C-contiguous (N, *input_shape) in the
        model dtype and ``y`` as int64 (N,).  Raises ValueError as :meth:`loss_and_grad` does."""
        x = self._check_x(x)
        return x, self._check_y(y, x.shape[0])

    # -- compute --------------------------------------------------------------------------
    def _forward(self, x: np.ndarray) -> np.ndarray:
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def _loss(self, logits: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        if self._dlogits is None or self._dlogits.shape != logits.shape:
            self._dlogits = np.empty(logits.shape, self.dtype)
        loss, correct = softmax_cross_entropy(logits, y, self._dlogits)
        return float(loss), int(correct)

    def loss_and_grad(self, x, y) -> tuple[float, int]:
        """Forward and backward on one batch; overwrite :attr:`grad` with d(mean loss)/d(params).

        Parameters
        ----------
        x : (B, *input_shape) float32 (other real dtypes are converted)
        y : (B,) integer class ids in ``[0, n_classes)``

        Returns
        -------
        loss : float
            Mean softmax cross-entropy over the batch.
        n_correct : int
            Samples whose arg-max logit equals the label.

        Raises
        ------
        ValueError
            Wrong x shape, non-finite x, y of the wrong length or with labels out of range.
        """
        x = self._check_x(x)
        y = self._check_y(y, x.shape[0])
        self._set_mode("train")
        loss, correct = self._loss(self._forward(x), y)
        dy = self._dlogits
        for i in range(len(self.layers) - 1, -1, -1):
            dy = self.layers[i].backward(dy, need_dx=i > self._first_param_layer)
        return loss, correct

    def predict(self, x, batch_size: int = 256) -> np.ndarray:
        """Class ids (B,) int64 of the arg-max logit for each sample of ``x``."""
        x = self._check_x(x)
        self.calibrate()
        self._set_mode("eval")
        out = np.empty(x.shape[0], np.int64)
        for s in range(0, x.shape[0], batch_size):
            out[s:s + batch_size] = self._forward(x[s:s + batch_size]).argmax(axis=1)
        return out

    def evaluate(self, x, y, batch_size: int = 64) -> tuple[float, float]:
        """Mean loss and accuracy over a whole data set, in batches; parameters unchanged.

        Parameters
        ----------
        x : (N, *input_shape), y : (N,) as for :meth:`loss_and_grad`
        batch_size : int

        Returns
        -------
        mean_loss : float
        accuracy : float in [0, 1]
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        x = self._check_x(x)
        y = self._check_y(y, x.shape[0])
        self.calibrate()
        self._set_mode("eval")
        total, correct = 0.0, 0
        for s in range(0, x.shape[0], batch_size):
            xb, yb = x[s:s + batch_size], y[s:s + batch_size]
            loss, c = self._loss(self._forward(xb), yb)
            total += loss * xb.shape[0]
            correct += c
        n = x.shape[0]
        return total / n, correct / n


def _walk(layers):
    """Every layer, and the parts of composite layers (residual blocks)."""
    for layer in layers:
        yield layer
        yield from _walk(getattr(layer, "parts", []))


def _mlp(sizes: list[int]) -> tuple[list[Layer], tuple, int]:
    layers: list[Layer] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = i == len(sizes) - 2
        layers.append(Dense(a, b, init="glorot" if last else "he", relu=not last))
    return layers, (sizes[0],), sizes[-1]


def _mlp_sizes(spec: str) -> list[int]:
    """``'mlp:784-10'`` -> ``[784, 10]``, or a ValueError naming what is wrong."""
    body = spec.strip().lower()[4:]
    if not re.fullmatch(r"\d+(-\d+)+", body):
        raise ValueError(f"malformed mlp spec {spec!r}; {SPEC_HELP}")
    sizes = [int(t) for t in body.split("-")]
    if min(sizes) < 1:
        raise ValueError(f"mlp spec {spec!r} has a zero size; {SPEC_HELP}")
    if sizes[-1] < 2:
        raise ValueError(f"mlp spec {spec!r} needs at least 2 classes in its last size")
    return sizes


def build_model(spec: str, seed: int = 0, dtype=np.float32, input_shape: tuple | None = None,
                n_classes: int | None = None) -> Model:
    """Build a model from its spec with deterministic initialisation.

    Parameters
    ----------
    spec : str
        ``'mlp:N0-N1-...-NK'``: dense layers N0 -> N1 -> ... -> NK with ReLU between
        (He-normal init, Glorot-uniform for the output layer); input (N0,), NK classes.
        ``'lenet'``: conv5x5x16 (pad 2) - relu - pool2 - conv5x5x32 (pad 2) - relu - pool2 -
        dense128 - relu - dense10 on (1, 28, 28).
        ``'cifar-cnn'``, ``'resnet8'``, ``'resnet20'``: presets on ``input_shape`` (default
        (3, 32, 32)) with ``n_classes`` outputs (default 10); see :data:`psgd.nn.spec.PRESETS`.
        Anything else: layer tokens joined by ``-`` (:func:`psgd.nn.spec.build_layers`) on
        ``input_shape``, its last token ``dense:N`` giving the classes.
    seed : int
        Same seed -> bitwise identical parameters.
    dtype : numpy dtype
        float32 (the default, and what MPI training uses); float64 for gradient checks.
    input_shape : tuple of int, optional
        Per-sample input, (C, H, W) or (D,): a dataset's.  Required by token specs;
        ignored by mlp and lenet, whose input is fixed.
    n_classes : int, optional
        The outputs of a preset other than lenet.

    Returns
    -------
    Model

    Raises
    ------
    ValueError
        Unknown or malformed spec (:class:`psgd.nn.spec.SpecError` names the token).
    """
    if not isinstance(spec, str):
        raise ValueError(f"model spec must be a string, got {type(spec).__name__}; {SPEC_HELP}")
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    layers, shape, classes = model_layers(spec, seed, input_shape, n_classes)
    return Model(spec.strip(), layers, shape, classes, seed=seed, dtype=dtype)


def model_layers(spec: str, seed: int = 0, input_shape: tuple | None = None,
                 n_classes: int | None = None) -> tuple[list[Layer], tuple, int]:
    """The layers of ``spec`` (no parameters allocated yet), the input shape and the classes;
    the arguments as :func:`build_model`'s."""
    if spec.strip().lower().startswith("mlp:"):
        return _mlp(_mlp_sizes(spec))
    fixed = spec.strip().lower() == "lenet"
    text, default_shape = expand_preset(spec, None if fixed else n_classes)
    shape = default_shape if fixed or input_shape is None else tuple(input_shape)
    if shape is None:
        raise ValueError(f"model spec {spec!r} takes its input shape from the data, and none was "
                         f"given (input_shape=...)")
    layers, classes = build_layers(text, shape, seed=seed)
    return layers, shape, classes
