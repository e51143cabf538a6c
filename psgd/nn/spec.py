"""The sequential model spec language (``conv:32x3:pad1-bn-relu-pool:2-...-dense:10``) and its presets."""
from __future__ import annotations

import re

from psgd.errors import UsageError

from psgd.nn.elementwise import Dropout, LeakyReLU, Sigmoid, Tanh
from psgd.nn.layers import (AvgPool2D, ChannelsLast, Conv2D, Dense, Flatten, GlobalAvgPool, Layer,
                            MaxPool2D, ReLU)
from psgd.nn.norm import BatchNorm
from psgd.nn.residual import Residual

#: one line per token, as shown in error messages and in ``psgd train --help``
TOKENS = {
    "conv": "conv:FxK or conv:FxKHxKW, options :sS (stride) :padP (zero padding)",
    "pool": "pool:K[:sS] (max pooling; also maxpool:)",
    "avgpool": "avgpool:K[:sS]",
    "gap": "gap (global average pooling: HxWxC -> C)",
    "flatten": "flatten (HxWxC -> H*W*C)",
    "dense": "dense:N",
    "relu": "relu", "lrelu": "lrelu[:ALPHA] (leaky ReLU, default 0.01)",
    "tanh": "tanh", "sigmoid": "sigmoid",
    "dropout": "dropout:P (0 <= P < 1; off at evaluation)",
    "bn": "bn (batch normalisation)",
    "res": "res:F[:sS] (residual block of two 3x3 convs with bn)",
}
TOKEN_HELP = "; ".join(TOKENS.values())
_REGISTERED: dict = {}   # token -> make(args, shape), from register()
MONOTONE = ("relu", "lrelu", "tanh", "sigmoid")
#: the init of every conv and dense token: PyTorch's default (see psgd.nn.layers.init_weights)
INIT = "uniform"

_CIFAR_CNN = ("conv:32x3:pad1-bn-relu-conv:32x3:pad1-bn-relu-pool:2-"
              "conv:64x3:pad1-bn-relu-conv:64x3:pad1-bn-relu-pool:2-"
              "conv:128x3:pad1-bn-relu-pool:2-flatten-dense:128-relu-dropout:0.25-dense:{classes}")
_STEM = "conv:16x3:pad1-bn-relu-"
#: name -> (spec with {classes}, default input shape (C, H, W))
PRESETS = {
    "lenet": ("conv:16x5:pad2-relu-pool:2-conv:32x5:pad2-relu-pool:2-flatten-dense:128-relu-"
              "dense:{classes}", (1, 28, 28)),
    "cifar-cnn": (_CIFAR_CNN, (3, 32, 32)),
    "resnet8": (_STEM + "res:16-res:32:s2-res:64:s2-gap-dense:{classes}", (3, 32, 32)),
    "resnet20": (_STEM + "res:16-res:16-res:16-res:32:s2-res:32-res:32-res:64:s2-res:64-res:64-"
                 "gap-dense:{classes}", (3, 32, 32)),
}


class SpecError(UsageError):
    """A spec that does not parse or does not fit its input; the message names the token."""


def register(token: str, help_text: str, make) -> None:
    """Add a layer token from outside psgd: one line of help (as :data:`TOKENS`) and
    ``make(args, shape)``, the layer for the token's ``:``-separated arguments on input
    ``shape`` (per sample; raise SpecError or ValueError for bad ones)."""
    global TOKEN_HELP
    if token in TOKENS:
        raise UsageError(f"layer token {token!r} is registered already")
    TOKENS[token] = help_text
    _REGISTERED[token] = make
    TOKEN_HELP = "; ".join(TOKENS.values())


def _fmt(shape: tuple) -> str:
    return "x".join(map(str, shape)) if len(shape) == 3 else f"a vector of {shape[0]}"


class _Token:
    """One '-'-separated token: its position, text, name and ':'-separated arguments."""

    def __init__(self, spec: str, index: int, text: str) -> None:
        self.spec, self.index, self.text = spec, index, text
        self.name, *self.args = text.split(":")

    def fail(self, what: str) -> SpecError:
        return SpecError(f"model spec {self.spec!r}: token {self.index + 1} {self.text!r} {what}")

    def number(self, text: str, kind=int, what: str = "a number"):
        try:
            value = kind(text)
        except ValueError:
            raise self.fail(f"has {text!r} where {what} was expected; "
                            f"expected {TOKENS.get(self.name, TOKEN_HELP)}") from None
        return value

    def options(self, start: int, allowed: dict) -> dict:
        """Parse ``:s2``-style options after the positional arguments (``allowed``: prefix -> default)."""
        found = dict(allowed)
        for text in self.args[start:]:
            m = re.fullmatch(r"([a-z]+)(\d+)", text)
            if not m or m.group(1) not in allowed:
                raise self.fail(f"has an unknown option {text!r}; expected {TOKENS[self.name]}")
            found[m.group(1)] = int(m.group(2))
        return found

    def arity(self, lo: int, hi: int) -> None:
        if not lo <= len(self.args) <= hi:
            raise self.fail(f"has {len(self.args)} argument(s); expected {TOKENS[self.name]}")


def _conv(t: _Token, shape: tuple) -> Layer:
    if not t.args:
        raise t.fail(f"needs filters and a kernel size; expected {TOKENS['conv']}")
    dims = t.args[0].split("x")
    if len(dims) not in (2, 3):
        raise t.fail(f"has {t.args[0]!r}; expected {TOKENS['conv']}")
    f, *k = [t.number(d, what="a positive integer") for d in dims]
    opt = t.options(1, {"s": 1, "pad": 0})
    if min(f, *k, opt["s"]) < 1:
        raise t.fail("needs positive filters, kernel size and stride")
    kh, kw = (k[0], k[0]) if len(k) == 1 else k
    oh, ow = (shape[0] + 2 * opt["pad"] - kh) // opt["s"] + 1, (shape[1] + 2 * opt["pad"] - kw) // opt["s"] + 1
    if oh < 1 or ow < 1:
        raise t.fail(f"does not fit its {_fmt(shape)} input: it would leave {max(oh, 0)}x{max(ow, 0)} pixels")
    return Conv2D(shape, f, (kh, kw), stride=opt["s"], pad=opt["pad"], init=INIT)


def _pool(t: _Token, shape: tuple, cls) -> Layer:
    t.arity(1, 2)
    k = t.number(t.args[0], what="a positive integer")
    s = t.options(1, {"s": k})["s"]
    if k < 1 or s < 1:
        raise t.fail("needs a positive window and stride")
    oh, ow = (shape[0] - k) // s + 1, (shape[1] - k) // s + 1
    if oh < 1 or ow < 1:
        raise t.fail(f"does not fit its {_fmt(shape)} input: it would leave 0 pixels")
    return cls(shape, k=k, stride=s)


def _layer(t: _Token, shape: tuple, prev: Layer | None, seed: int) -> Layer:
    """The layer one token makes on input ``shape`` (per sample, channels-last for images)."""
    image = len(shape) == 3
    # whose output buffer an activation may overwrite: layers whose backward does not read it
    inplace = (isinstance(prev, (Conv2D, Dense, BatchNorm, MaxPool2D, AvgPool2D, GlobalAvgPool))
               and not getattr(prev, "relu", False))
    name = t.name
    if name not in TOKENS and name != "maxpool":
        raise t.fail(f"is not a layer; expected one of: {TOKEN_HELP}")
    if name in _REGISTERED:
        try:
            return _REGISTERED[name](tuple(t.args), shape)
        except ValueError as exc:
            raise t.fail(str(exc)) from None
    if name in ("conv", "pool", "maxpool", "avgpool", "gap", "flatten", "res") and not image:
        raise t.fail(f"needs an image (HxWxC) input, but follows {_fmt(shape)}")
    if name in ("gap", "flatten", "relu", "tanh", "sigmoid", "bn"):
        t.arity(0, 0)
    if name == "conv":
        return _conv(t, shape)
    if name in ("pool", "maxpool", "avgpool"):
        return _pool(t, shape, AvgPool2D if name == "avgpool" else MaxPool2D)
    if name == "gap":
        return GlobalAvgPool(shape)
    if name == "flatten":
        return Flatten(shape)
    if name == "dense":
        t.arity(1, 1)
        if image:
            raise t.fail(f"follows a {_fmt(shape)} image; put 'flatten' or 'gap' before it")
        n = t.number(t.args[0], what="a positive integer")
        if n < 1:
            raise t.fail("needs a positive width")
        return Dense(shape[0], n, init=INIT)
    if name == "relu":
        return ReLU(shape, inplace=inplace)
    if name == "lrelu":
        t.arity(0, 1)
        alpha = t.number(t.args[0], float, "a slope") if t.args else 0.01
        if not 0.0 < alpha < 1.0:
            raise t.fail(f"needs a slope in (0, 1), got {alpha}")
        return LeakyReLU(shape, alpha, inplace=inplace)
    if name == "tanh":
        return Tanh(shape, inplace=inplace)
    if name == "sigmoid":
        return Sigmoid(shape, inplace=inplace)
    if name == "dropout":
        t.arity(1, 1)
        p = t.number(t.args[0], float, "a probability")
        if not 0.0 <= p < 1.0:
            raise t.fail(f"needs a drop probability in [0, 1), got {p}")
        return Dropout(shape, p, seed=[seed, t.index])
    if name == "bn":
        return BatchNorm(shape)
    t.arity(1, 2)   # res
    f = t.number(t.args[0], what="a positive integer")
    s = t.options(1, {"s": 1})["s"]
    if f < 1 or s < 1:
        raise t.fail("needs positive filters and stride")
    return Residual(shape, f, stride=s)


def expand_preset(spec: str, n_classes: int | None) -> tuple[str, tuple | None]:
    """A preset's spec and default input shape, or ``(spec, None)`` for anything else."""
    name = spec.strip().lower()
    if name not in PRESETS:
        return spec, None
    text, shape = PRESETS[name]
    return text.format(classes=10 if n_classes is None else int(n_classes)), shape


def build_layers(spec: str, input_shape: tuple, seed: int = 0) -> tuple[list[Layer], int]:
    """The layers of a sequential spec on per-sample ``input_shape``, and the number of classes.

    Parameters
    ----------
    spec : str
        Tokens separated by ``-`` (see :data:`TOKENS`); the last one is ``dense:N``
        (the N class logits).
    input_shape : (C, H, W) for images (NCHW; a channels-last transpose goes first) or (D,)
    seed : int
        Seeds the dropout layers' first masks.

    Raises
    ------
    SpecError
        A token that is unknown, malformed or does not fit the shape before it.
    """
    if not spec.strip():
        raise SpecError(f"model spec {spec!r} is empty; expected lenet, cifar-cnn, resnet8, "
                        f"resnet20, mlp:N0-...-NK or layer tokens joined by '-': {TOKEN_HELP}")
    tokens = [_Token(spec, i, text) for i, text in enumerate(spec.strip().lower().split("-"))]
    for t in tokens:
        if not t.text:
            raise SpecError(f"model spec {spec!r}: token {t.index + 1} is empty (two '-' in a row "
                            f"or one at an end)")
    # max pooling commutes with these monotone activations, outputs and gradients alike:
    # build 'relu-pool:2' as pool then relu, which then touches a quarter of the elements
    for i in range(len(tokens) - 1):
        if tokens[i].name in MONOTONE and tokens[i + 1].name in ("pool", "maxpool"):
            tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
    shape = tuple(int(d) for d in input_shape)
    layers: list[Layer] = []
    if len(shape) == 3:
        layers.append(ChannelsLast(shape))
        shape = layers[-1].out_shape
    elif len(shape) != 1:
        raise SpecError(f"model spec {spec!r}: inputs of shape {shape} are neither (C, H, W) nor (D,)")
    fused = 0
    for t in tokens:
        prev = layers[-1] if layers else None
        layer = _layer(t, shape, prev, seed)
        if type(layer) is ReLU and isinstance(prev, (BatchNorm, Dense)) and not prev.relu:
            prev.relu = True  # 'bn-relu', 'dense:N-relu': one layer, one pass over memory less each way
            fused += 1
            continue
        if isinstance(layer, Dropout):  # its masks as when every token was a layer of its own
            layer.mask_index = len(layers) + fused
        layers.append(layer)
        shape = layer.out_shape
    last = tokens[-1]
    if not isinstance(layers[-1], Dense):
        raise last.fail("ends the spec; the last token must be dense:N (the class logits)")
    if layers[-1].out_shape[0] < 2:
        raise last.fail("gives fewer than 2 classes")
    return layers, layers[-1].out_shape[0]
