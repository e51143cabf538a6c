"""Layer objects whose weights and gradients are views into a model's flat parameter and gradient vectors."""
# Image activations between layers are channels-last, (B, H, W, C); ChannelsLast converts
# the NCHW model input once, at the front of a convolutional network.  Each layer reuses
# its own output and scratch buffers from step to step, so an array returned by forward
# or backward is valid only until the next call on the same layer.  Dense, Conv2D and
# BatchNorm read their forward input again in backward: nothing may write it in between
# (an in-place activation writes only an output whose layer's backward does not read it).
from __future__ import annotations

import math

import numpy as np

from psgd.kernels.activation import relu_backward, relu_forward
from psgd.kernels.conv import conv2d_backward, conv2d_forward, conv_out_size
from psgd.kernels.winograd import winograd_backward, winograd_forward, winograd_plane, winograd_shapes
from psgd.kernels.winograd5 import winograd5_backward, winograd5_forward, winograd5_shapes
from psgd.kernels.dense import dense_backward_input, dense_backward_params, dense_forward
from psgd.kernels.pool import (avgpool2d_backward, avgpool2d_forward, global_avgpool_backward,
                               global_avgpool_forward, maxpool2d_backward, maxpool2d_forward,
                               pool_out_size)

CHUNK_BYTES = 1 << 20       # im2col rows per conv GEMM round (see Conv2D)
KEEP_COLS_BYTES = 8 << 20   # a conv keeps its batch's im2col matrix up to this size
WINOGRAD_CHUNK_BYTES = 1 << 20  # transformed tiles and their products per Winograd round
WINOGRAD_MIN_CHANNELS = 32  # fewer input channels: im2col as fast or faster (bench/bench_winograd.py)
WINOGRAD5_MIN_CHANNELS = 16  # the same for 5x5 kernels, F(2x2, 5x5)
KEEP_TILES_BYTES = 8 << 20  # a 5x5 Winograd conv keeps its batch's transformed input up to this size
INITS = ("uniform", "he", "glorot")
INIT_BLOCK_VALUES = 1 << 20  # float64 values drawn at once when filling a layer's weights


def init_weights(w: np.ndarray, b: np.ndarray, fan_in: int, fan_out: int, init: str,
                 rng: np.random.Generator) -> None:
    """Fill a layer's weights ``w`` and biases ``b`` in place.

    ``"uniform"`` is PyTorch's default for nn.Linear and nn.Conv2d (kaiming_uniform with
    a = sqrt(5)): weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)).  ``"he"``: weights
    normal with std sqrt(2/fan_in); ``"glorot"``: weights U(+-sqrt(6/(fan_in+fan_out))); both
    with zero biases.  The weights are drawn a block of rows at a time (the same values as
    one draw), so a wide layer never has a float64 copy of its whole.
    """
    rows = w.reshape(-1, w.shape[-1])     # a view: the weights as (rows, last axis)
    block = max(1, INIT_BLOCK_VALUES // rows.shape[1])
    for r0, values in weight_draws(rows.shape, b.size, fan_in, fan_out, init, rng, block):
        if r0 < rows.shape[0]:
            rows[r0:r0 + len(values)] = values
        else:
            b[...] = values[0]


def weight_draws(shape: tuple, n_bias: int, fan_in: int, fan_out: int, init: str,
                 rng: np.random.Generator, block_rows: int | None = None):
    """What :func:`init_weights` draws, in its order: ``(row0, values)`` for the weights'
    rows (``shape`` = (rows, columns)), ``block_rows`` rows at a time (all by default), then
    ``(rows, bias)`` with the bias as one (1, n_bias) row; float64.  A generator's values come
    one after another, so every ``block_rows`` gives the same values."""
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; choose one of {', '.join(INITS)}")
    if init == "he":
        std = math.sqrt(2.0 / fan_in)
        draw = lambda size: rng.normal(0.0, std, size)   # noqa: E731
    else:
        lim = 1.0 / math.sqrt(fan_in) if init == "uniform" else math.sqrt(6.0 / (fan_in + fan_out))
        draw = lambda size: rng.uniform(-lim, lim, size)  # noqa: E731
    rows, cols = shape
    step = rows if block_rows is None else max(1, int(block_rows))
    for r0 in range(0, rows, step):
        yield r0, draw((min(step, rows - r0), cols))
    yield rows, draw((1, n_bias)) if init == "uniform" else np.zeros((1, n_bias))


class Layer:
    """A layer with no parameters; subclasses override what they need.

    Attributes
    ----------
    in_shape, out_shape : tuple of int
        Per-sample shapes of the input and the output (no batch axis).
    mode : str
        ``"train"`` (dropout on, batch statistics), ``"eval"`` (dropout off, stored
        statistics) or ``"calibrate"`` (dropout off, batch statistics, which batch-norm
        layers also accumulate); set by the model for all its layers.
    """

    in_shape: tuple
    out_shape: tuple
    mode: str = "train"

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def set_mode(self, mode: str) -> None:
        """Switch between ``"train"``, ``"eval"`` and ``"calibrate"`` (see :attr:`mode`)."""
        self.mode = mode

    def param_shapes(self) -> list[tuple[str, tuple]]:
        """The (name, shape) of each parameter array, in flat-vector order."""
        return []

    def bind(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        """Attach views into the flat vectors: ``params[name]`` and ``grads[name]``."""

    def init_params(self, rng: np.random.Generator) -> None:
        """Fill the bound parameter views from ``rng`` (deterministic given its state)."""

    def forward(self, x: np.ndarray) -> np.ndarray:
        """Forward pass on a batch ``x`` of shape (B, *in_shape); returns (B, *out_shape)."""
        raise NotImplementedError

    def backward(self, dy: np.ndarray, need_dx: bool = True) -> np.ndarray | None:
        """Backward pass for the last ``forward``: write parameter gradients, return dx.

        Parameters
        ----------
        dy : (B, *out_shape) gradient of the loss w.r.t. the output
        need_dx : bool
            False for the first layer, whose input gradient nobody uses.
        """
        raise NotImplementedError

    def _buf(self, key: str, shape: tuple, dtype) -> np.ndarray:
        buf = self._bufs.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = np.empty(shape, dtype)
            self._bufs[key] = buf
        return buf

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.in_shape} -> {self.out_shape})"


class Dense(Layer):
    """Affine layer ``y = x @ w + b``; ``w`` is (n_in, n_out), ``b`` is (n_out,).

    ``init`` is one of :data:`INITS` (see :func:`init_weights`; ``"uniform"``, PyTorch's
    default, is what the spec builder gives).
    With ``relu=True`` the layer is the affine map then ReLU, applied in the bias pass
    forward and in the bias-gradient pass backward (the model builders make ``dense-relu``
    so); its backward then overwrites ``dy`` with the masked gradient when ``dy`` is a
    writeable C-contiguous array (the next layer's scratch, as an in-place ReLU would).
    """

    def __init__(self, n_in: int, n_out: int, init: str = "he", relu: bool = False) -> None:
        super().__init__()
        self.in_shape, self.out_shape = (n_in,), (n_out,)
        self.init = init
        self.relu = bool(relu)

    def param_shapes(self):
        return [("w", (self.in_shape[0], self.out_shape[0])), ("b", self.out_shape)]

    def bind(self, params, grads):
        self.w, self.b = params["w"], params["b"]
        self.dw, self.db = grads["w"], grads["b"]

    def init_params(self, rng):
        init_weights(self.w, self.b, *self.w.shape, self.init, rng)

    def forward(self, x):
        self._x = x
        out = self._buf("out", (x.shape[0], self.out_shape[0]), x.dtype)
        self._out = out
        return dense_forward(x, self.w, self.b, out, self.relu)

    def backward(self, dy, need_dx=True):
        if self.relu:
            if not (dy.flags.c_contiguous and dy.flags.writeable):
                own = self._buf("dy", dy.shape, dy.dtype)
                own[...] = dy
                dy = own
            dense_backward_params(self._x, dy, self.dw, self.db, self._out)
        else:
            dense_backward_params(self._x, dy, self.dw, self.db)
        if not need_dx:
            return None
        dx = self._buf("dx", self._x.shape, dy.dtype)
        return dense_backward_input(self.w, dy, dx)

    def __repr__(self) -> str:
        return f"Dense{'+ReLU' if self.relu else ''}({self.in_shape} -> {self.out_shape})"


class Conv2D(Layer):
    """2-D convolution on channels-last input (H, W, C) with F filters of size kh x kw.

    One parameter array ``wb`` of shape (kh*kw*C + 1, F): weights ``w`` (kh, kw, C, F) then
    bias ``b`` (F,), both exposed as views (see :mod:`psgd.kernels.conv`).  ``k`` is an int
    (square) or a pair (kh, kw).  Zero padding ``pad`` on all sides; ``init`` as
    for :class:`Dense` (default PyTorch's, U(+-1/sqrt(kh*kw*C)) for weights and biases).  ``winograd``: compute a stride-1 3x3 convolution by
    Winograd F(2x2, 3x3) (:mod:`psgd.kernels.winograd`), or a stride-1 5x5 one by F(2x2, 5x5)
    (:mod:`psgd.kernels.winograd5`), rather than im2col; None (the default) chooses it when the
    input has at least ``WINOGRAD_MIN_CHANNELS`` (3x3) or ``WINOGRAD5_MIN_CHANNELS`` (5x5) channels.
    """

    def __init__(self, in_shape: tuple, filters: int, k, stride: int = 1, pad: int = 0,
                 winograd: bool | None = None, init: str = "uniform") -> None:
        super().__init__()
        self.init = init
        h, w, c = in_shape
        kh, kw = (k, k) if isinstance(k, int) else tuple(k)
        oh, ow = conv_out_size(h, kh, stride, pad), conv_out_size(w, kw, stride, pad)
        if oh < 1 or ow < 1:
            raise ValueError(f"Conv2D k={kh}x{kw} stride={stride} pad={pad} does not fit input {in_shape}")
        self.in_shape, self.out_shape = tuple(in_shape), (oh, ow, filters)
        self.kh, self.kw, self.stride, self.pad = kh, kw, stride, pad
        self._k_rows = kh * kw * c
        # samples per im2col + GEMM round: about 1 MiB of float32 cols, so the GEMM reads what
        # im2col just wrote from L2 cache; a batch's whole im2col matrix is kept from forward
        # to backward (not computed again) only when it is small, as for a first layer's few channels
        self.chunk = max(1, CHUNK_BYTES // (oh * ow * (self._k_rows + 1) * 4))
        fits = kh == kw and kh in (3, 5) and stride == 1
        if winograd and not fits:
            raise ValueError(f"Conv2D k={kh}x{kw} stride={stride}: Winograd needs a 3x3 or 5x5 kernel "
                             f"at stride 1")
        self._tiles, self._padded = (winograd_shapes if kh == 3 else winograd5_shapes)(h, w, pad)
        self._elems = (kh + 1) ** 2     # transformed elements per tile: 16 or 36
        least = WINOGRAD_MIN_CHANNELS if kh == 3 else WINOGRAD5_MIN_CHANNELS
        self.winograd = fits and (c >= least if winograd is None else winograd)
        if self.winograd:   # samples per round: their tiles' V and M in about 1 MiB of L2
            self.chunk = max(1, WINOGRAD_CHUNK_BYTES // (self._tiles * self._elems * (c + filters) * 4))

    def param_shapes(self):
        return [("wb", (self._k_rows + 1, self.out_shape[2]))]

    def bind(self, params, grads):
        self.wb, self.dwb = params["wb"], grads["wb"]
        wshape = (self.kh, self.kw, self.in_shape[2], self.out_shape[2])
        self.w, self.b = self.wb[:-1].reshape(wshape), self.wb[-1]
        self.dw, self.db = self.dwb[:-1].reshape(wshape), self.dwb[-1]

    def init_params(self, rng):
        init_weights(self.w, self.b, self._k_rows, self._k_rows // self.in_shape[2] * self.out_shape[2],
                     self.init, rng)

    def forward(self, x):
        n = x.shape[0]
        oh, ow, f = self.out_shape
        self._x = x
        out = self._buf("out", (n, oh, ow, f), x.dtype)
        if self.winograd:
            fwd = winograd_forward if self.kh == 3 else winograd5_forward
            return fwd(x, self.wb, self.pad, *self._winograd_bufs(x), out, self.chunk)
        return conv2d_forward(x, self.wb, self.kh, self.kw, self.stride, self.pad, self._cols(x), out,
                              self.chunk)

    def backward(self, dy, need_dx=True):
        x = self._x
        dx = self._buf("dx", x.shape, dy.dtype) if need_dx else np.empty((0, 0, 0, 0), dy.dtype)
        if self.winograd:
            u, xp, vbuf, mbuf = self._winograd_bufs(x)
            du = self._buf("du", u.shape, x.dtype)
            bwd = winograd_backward if self.kh == 3 else winograd5_backward
            bwd(x, dy, self.pad, u, xp, vbuf, mbuf, du, self.dwb, dx, self.chunk)
            return dx if need_dx else None
        conv2d_backward(x, self.wb, dy, self.kh, self.kw, self.stride, self.pad, self._cols(x),
                        self.dwb, dx, self.chunk)
        return dx if need_dx else None

    def _winograd_bufs(self, x):
        """The transformed filters U and the scratch of one round: padded input, V, M."""
        c, f, n, e = self.in_shape[2], self.out_shape[2], min(x.shape[0], self.chunk), self._elems
        # F(2x2, 5x5)'s backward reuses the forward's V when the batch's fits (saving a transform)
        keep = self.kh == 5 and e * x.shape[0] * self._tiles * c * x.itemsize <= KEEP_TILES_BYTES
        return (self._buf("u", (e, c, f), x.dtype), self._buf("xp", (n, *self._padded, c), x.dtype),
                self._buf("v", (e, winograd_plane((x.shape[0] if keep else n) * self._tiles, c)), x.dtype),
                self._buf("m", (e, winograd_plane(n * self._tiles, f)), x.dtype))

    def _cols(self, x):
        n, (oh, ow, _) = x.shape[0], self.out_shape
        whole = n * oh * ow * (self._k_rows + 1) * x.itemsize <= KEEP_COLS_BYTES
        return self._buf("cols", ((n if whole else min(n, self.chunk)) * oh * ow, self._k_rows + 1), x.dtype)


class _Pool2D(Layer):
    """Pooling over k x k windows (no padding, stride k unless given) on channels-last input (H, W, C)."""

    def __init__(self, in_shape: tuple, k: int = 2, stride: int | None = None) -> None:
        super().__init__()
        stride = k if stride is None else stride
        h, w, c = in_shape
        oh, ow = pool_out_size(h, k, stride), pool_out_size(w, k, stride)
        if oh < 1 or ow < 1:
            raise ValueError(f"{type(self).__name__} k={k} stride={stride} does not fit input {in_shape}")
        self.in_shape, self.out_shape = tuple(in_shape), (oh, ow, c)
        self.k, self.stride = k, stride

    def _dx(self, dy):
        return self._buf("dx", (dy.shape[0], *self.in_shape), dy.dtype)


class MaxPool2D(_Pool2D):
    """Max pooling; backward routes each gradient to its window's arg-max."""

    def forward(self, x):
        n = x.shape[0]
        out = self._buf("out", (n, *self.out_shape), x.dtype)
        self._argmax = self._buf("argmax", (n, *self.out_shape), np.int32)
        return maxpool2d_forward(x, self.k, self.stride, out, self._argmax)

    def backward(self, dy, need_dx=True):
        return maxpool2d_backward(dy, self._argmax, self.k, self.stride, self._dx(dy)) if need_dx else None


class AvgPool2D(_Pool2D):
    """Average pooling; backward spreads each gradient evenly over its window."""

    def forward(self, x):
        out = self._buf("out", (x.shape[0], *self.out_shape), x.dtype)
        return avgpool2d_forward(x, self.k, self.stride, out)

    def backward(self, dy, need_dx=True):
        return avgpool2d_backward(dy, self.k, self.stride, self._dx(dy)) if need_dx else None


class GlobalAvgPool(Layer):
    """The mean of each channel over all pixels: (H, W, C) -> (C,)."""

    def __init__(self, in_shape: tuple) -> None:
        super().__init__()
        self.in_shape, self.out_shape = tuple(in_shape), (in_shape[2],)

    def forward(self, x):
        out = self._buf("out", (x.shape[0], *self.out_shape), x.dtype)
        return global_avgpool_forward(x, out)

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return None
        dx = self._buf("dx", (dy.shape[0], *self.in_shape), dy.dtype)
        return global_avgpool_backward(np.ascontiguousarray(dy), dx)


class Elementwise(Layer):
    """An elementwise activation whose backward needs only its output; any shape.

    With ``inplace=True`` forward overwrites its input and backward its ``dy``: right when
    the input is the output buffer of a Dense, Conv2D or BatchNorm layer (whose backward
    does not read it) and ``dy`` is the next layer's scratch, as in the models
    :func:`psgd.nn.model.build_model` makes; it saves a pass over memory and keeps the
    working set small.  Subclasses give ``_fwd(x, out)`` and ``_bwd(out, dy, dx)`` on flat views.
    """

    def __init__(self, shape: tuple, inplace: bool = False) -> None:
        super().__init__()
        self.in_shape = self.out_shape = tuple(shape)
        self.inplace = inplace

    def _fwd(self, x, out):
        raise NotImplementedError

    def _bwd(self, out, dy, dx):
        raise NotImplementedError

    def forward(self, x):
        out = x if self.inplace and x.flags.c_contiguous else self._buf("out", x.shape, x.dtype)
        self._fwd(x.reshape(-1), out.reshape(-1))
        self._out = out
        return out

    def backward(self, dy, need_dx=True):
        if not need_dx:
            return None
        dx = dy if self.inplace and dy.flags.c_contiguous else self._buf("dx", dy.shape, dy.dtype)
        self._bwd(self._out.reshape(-1), dy.reshape(-1), dx.reshape(-1))
        return dx


class ReLU(Elementwise):
    """``max(x, 0)``."""

    def _fwd(self, x, out):
        relu_forward(x, out)

    def _bwd(self, out, dy, dx):
        relu_backward(out, dy, dx)


class Flatten(Layer):
    """Reshape (B, *in_shape) to (B, prod(in_shape)); a view, no copy."""

    def __init__(self, in_shape: tuple) -> None:
        super().__init__()
        self.in_shape, self.out_shape = tuple(in_shape), (int(np.prod(in_shape)),)

    def forward(self, x):
        return x.reshape(x.shape[0], *self.out_shape)   # also for an empty batch

    def backward(self, dy, need_dx=True):
        return dy.reshape(dy.shape[0], *self.in_shape) if need_dx else None


class ChannelsLast(Layer):
    """Transpose an NCHW batch (C, H, W per sample) to channels-last (H, W, C); free when C == 1."""

    def __init__(self, in_shape: tuple) -> None:
        super().__init__()
        c, h, w = in_shape
        self.in_shape, self.out_shape = tuple(in_shape), (h, w, c)

    def forward(self, x):
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1))

    def backward(self, dy, need_dx=True):
        return np.ascontiguousarray(dy.transpose(0, 3, 1, 2)) if need_dx else None
