"""A psgd model as the same network in PyTorch (torch.nn.Sequential), with its flat vector carried both ways."""
# Test and benchmark only: importing this module imports torch (the `peer` extra).  The
# torch network is the natural one (NCHW, torch's own layer classes and default init);
# psgd's channels-last layouts are mapped onto it array by array:
#   Conv2D wb (kh*kw*C + 1, F)  ->  weight (F, C, kh, kw) and bias (F,)
#   Dense w (n_in, n_out)       ->  weight (n_out, n_in); after a flatten of an HxWxC image
#                                   psgd's rows are in (h, w, c) order, torch's in (c, h, w)
#   BatchNorm gamma, beta       ->  weight, bias
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from psgd.nn.elementwise import Dropout, LeakyReLU, Sigmoid, Tanh
from psgd.nn.layers import (AvgPool2D, ChannelsLast, Conv2D, Dense, Flatten, GlobalAvgPool,
                            MaxPool2D, ReLU)
from psgd.nn.norm import BatchNorm
from psgd.nn.residual import Residual


class MaskedDropout(nn.Module):
    """Inverted dropout whose keep mask is given (from psgd's draws); the identity in eval mode or without one."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p, self.mask = p, None

    def forward(self, x):
        if not self.training or self.mask is None:
            return x
        return x * self.mask.reshape(x.shape) / (1.0 - self.p)


class Block(nn.Module):
    """psgd's residual block: relu(bn(conv(relu(bn(conv_s(x))))) + shortcut(x))."""

    def __init__(self, c_in: int, filters: int, stride: int) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Conv2d(c_in, filters, 3, stride, 1), nn.BatchNorm2d(filters),
                                  nn.ReLU(), nn.Conv2d(filters, filters, 3, 1, 1),
                                  nn.BatchNorm2d(filters))
        self.shortcut = nn.Sequential()
        if stride != 1 or c_in != filters:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, filters, 1, stride, 0), nn.BatchNorm2d(filters))

    def forward(self, x):
        return torch.relu(self.main(x) + self.shortcut(x))


def _conv_link(layer: Conv2D, conv: nn.Conv2d):
    kh, kw, c, f = layer.kh, layer.kw, layer.in_shape[2], layer.out_shape[2]

    def to_torch(wb):
        return [wb[:-1].reshape(kh, kw, c, f).transpose(3, 2, 0, 1), wb[-1]]

    def to_psgd(w, b):
        return np.concatenate([w.transpose(2, 3, 1, 0).reshape(kh * kw * c, f), b[None, :]])

    return [conv.weight, conv.bias], to_torch, to_psgd


def _dense_link(layer: Dense, lin: nn.Linear, image: tuple | None):
    n_in, n_out = layer.in_shape[0], layer.out_shape[0]

    def to_torch(w):
        if image is not None:   # psgd's rows (h, w, c) -> torch's columns (c, h, w)
            w = w.reshape(*image, n_out).transpose(2, 0, 1, 3).reshape(n_in, n_out)
        return [w.T, None]

    def to_psgd(w, b):
        w = w.T
        if image is not None:
            h, wd, c = image
            w = w.reshape(c, h, wd, n_out).transpose(1, 2, 0, 3).reshape(n_in, n_out)
        return [w, b]

    return to_torch, to_psgd


def _links(layer, tm, image: tuple | None) -> list:
    """(psgd layer, array name, torch params, to_torch, to_psgd) for each of ``layer``'s arrays."""
    if isinstance(layer, Conv2D):
        params, fwd, inv = _conv_link(layer, tm)
        return [(layer, "wb", params, fwd, inv)]
    if isinstance(layer, Dense):
        fwd, inv = _dense_link(layer, tm, image)
        return [(layer, "w", [tm.weight], lambda w: fwd(w)[:1], lambda w: inv(w, None)[0]),
                (layer, "b", [tm.bias], lambda b: [b], lambda b: b)]
    if isinstance(layer, BatchNorm):
        return [(layer, "gamma", [tm.weight], lambda g: [g], lambda g: g),
                (layer, "beta", [tm.bias], lambda b: [b], lambda b: b)]
    return []


_SIMPLE = {MaxPool2D: lambda l: nn.MaxPool2d(l.k, l.stride), AvgPool2D: lambda l: nn.AvgPool2d(l.k, l.stride),
           ReLU: lambda l: nn.ReLU(), Tanh: lambda l: nn.Tanh(), Sigmoid: lambda l: nn.Sigmoid(),
           LeakyReLU: lambda l: nn.LeakyReLU(l.alpha), Flatten: lambda l: nn.Flatten()}


def _modules(layer) -> list[nn.Module]:
    """The torch modules for one psgd layer (the parameterised one first)."""
    if isinstance(layer, Conv2D):
        return [nn.Conv2d(layer.in_shape[2], layer.out_shape[2], (layer.kh, layer.kw), layer.stride, layer.pad)]
    if isinstance(layer, Dense):
        return [nn.Linear(*layer.in_shape, *layer.out_shape)] + ([nn.ReLU()] if layer.relu else [])
    if isinstance(layer, BatchNorm):
        c = layer.in_shape[-1]
        bn = nn.BatchNorm2d(c, eps=layer.eps) if len(layer.in_shape) == 3 else nn.BatchNorm1d(c, eps=layer.eps)
        return [bn] + ([nn.ReLU()] if layer.relu else [])
    if type(layer) in _SIMPLE:
        return [_SIMPLE[type(layer)](layer)]
    if isinstance(layer, GlobalAvgPool):
        return [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    if isinstance(layer, ChannelsLast):
        return []
    raise TypeError(f"no torch counterpart for {layer!r}")


class TorchPeer:
    """``model`` as ``net`` (a torch.nn.Sequential, torch's default init), and the maps between
    psgd's flat vector and the torch parameters.

    Parameters
    ----------
    model : psgd.nn.model.Model
    dropout : ``"torch"`` (nn.Dropout, torch's own masks) or ``"psgd"`` (:class:`MaskedDropout`,
        masks copied from psgd's last training forward by :meth:`copy_masks`)
    """

    def __init__(self, model, dropout: str = "torch") -> None:
        self.model = model
        modules, self.links, self.dropouts = [], [], []
        image = None   # the HxWxC shape a flatten just flattened
        for layer in model.layers:
            if isinstance(layer, Dropout):
                m = nn.Dropout(layer.p) if dropout == "torch" else MaskedDropout(layer.p)
                self.dropouts.append((layer, m))
                modules.append(m)
                continue
            if isinstance(layer, Residual):
                block = Block(layer.in_shape[2], layer.out_shape[2], layer.parts[0].stride)
                tmods = [m for m in [*block.main, *block.shortcut] if not isinstance(m, nn.ReLU)]
                for part, tm in zip([p for p in layer.parts if not isinstance(p, ReLU)], tmods):
                    self.links += _links(part, tm, None)
                modules.append(block)
                image = None
                continue
            mods = _modules(layer)
            if mods:
                self.links += _links(layer, mods[0], image)
            image = layer.in_shape if isinstance(layer, Flatten) else None if mods else image
            modules += mods
        self.net = nn.Sequential(*modules)
        self._ranges = self._flat_ranges()

    def _flat_ranges(self) -> list:
        """(lo, hi, shape) in the flat vector of each link's psgd array."""
        where = {}
        for i, name, lo, hi in self.model.param_ranges:
            layer = self.model.layers[i]
            if isinstance(layer, Residual):
                k, _, sub = name.partition(".")
                where[id(layer.parts[int(k)]), sub] = (lo, hi)
            else:
                where[id(layer), name] = (lo, hi)
        out = []
        for layer, name, *_ in self.links:
            shape = dict(layer.param_shapes())[name]
            out.append((*where[id(layer), name], shape))
        return out

    def load(self, flat: np.ndarray) -> None:
        """Copy a psgd flat parameter vector into the torch parameters."""
        with torch.no_grad():
            for (lo, hi, shape), (_, _, params, fwd, _) in zip(self._ranges, self.links):
                arrays = fwd(np.asarray(flat[lo:hi]).reshape(shape))
                for p, a in zip(params, arrays):
                    if a is not None:
                        p.copy_(torch.from_numpy(np.ascontiguousarray(a)).to(p.dtype))

    def flat(self, what: str = "params", dtype=np.float32) -> np.ndarray:
        """The torch parameters (``"params"``) or their ``.grad`` (``"grad"``) in psgd's flat layout."""
        out = np.zeros(self.model.n_params, dtype)
        for (lo, hi, shape), (_, _, params, _, inv) in zip(self._ranges, self.links):
            ts = [p if what == "params" else p.grad for p in params]
            arrays = [t.detach().numpy().astype(dtype) for t in ts]
            out[lo:hi] = np.asarray(inv(*arrays)).reshape(-1)
        return out

    def copy_masks(self) -> None:
        """Give each :class:`MaskedDropout` the keep mask of its psgd layer's last training forward."""
        for layer, m in self.dropouts:
            keep = layer._u >= np.float32(layer.p)     # the draws, in psgd's (channels-last) order
            shape = (-1, *layer.in_shape)
            mask = torch.from_numpy(keep.astype(np.float32)).reshape(shape)
            if len(layer.in_shape) == 3:   # HxWxC -> CxHxW
                mask = mask.permute(0, 3, 1, 2)
            m.mask = mask.contiguous()

    def copy_bn_statistics(self) -> None:
        """Set every torch batch norm's running mean and variance to psgd's calibrated statistics."""
        bns = [l for l in self.links if isinstance(l[0], BatchNorm) and l[1] == "gamma"]
        with torch.no_grad():
            for layer, _, params, _, _ in bns:
                tm = self._module_of(params[0])
                tm.running_mean.copy_(torch.from_numpy(layer.mean))
                tm.running_var.copy_(torch.from_numpy(layer.var))

    def _module_of(self, param):
        for m in self.net.modules():
            if getattr(m, "weight", None) is param:
                return m
        raise KeyError(param)
