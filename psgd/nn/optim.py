"""Optimizers over one flat float32 slice (by increasing complexity), and learning-rate schedules.

An optimizer owns the state of the slice it was made for (a server's shard, or
the whole vector under all-reduce), so the same code runs on a server and a worker.
Its numba kernel is imported at its first step, so a rank that never steps (a
hogwild server) never loads numba.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

OPTIMIZERS = ("sgd", "momentum", "nesterov", "adagrad", "adam")
SCHEDULES = ("constant", "step", "cosine", "inverse-sqrt", "optimal")
ADAGRAD_EPS = 1e-10          # PyTorch's defaults for AdaGrad
ADAGRAD_INITIAL = 0.0
DEFAULT_ALPHA = 1e-4         # scikit-learn SGDClassifier's


def _check_slices(params: np.ndarray, grad: np.ndarray, n: int, grad2=None, dst=None) -> None:
    if params.shape != (n,) or grad.shape != (n,):
        raise ValueError(f"optimizer made for {n} parameters got params {params.shape} "
                         f"and grad {grad.shape}")
    if dst is not None and dst.shape != (n,):
        raise ValueError(f"optimizer made for {n} parameters got dst {dst.shape}")
    if grad2 is not None and grad2.shape != (n,):
        raise ValueError(f"optimizer made for {n} parameters got a second grad {grad2.shape}")


class Optimizer:
    """Base: ``step`` in place, ``step_into`` out of place; each subclass gives its ``_step``.

    ``state_dict()`` returns per-element state as arrays of length ``n`` in ``dtype``
    (float32, or float64 for a float64 model; so shards concatenate into the full
    vector's state) and scalars as ints.
    """

    name = "base"
    state_keys: tuple[str, ...] = ()

    def __init__(self, n: int, weight_decay: float = 0.0, dtype=np.float32) -> None:
        if weight_decay < 0:
            raise ValueError(f"weight decay must be >= 0, got {weight_decay}")
        self.n = int(n)
        self.dtype = np.dtype(dtype)
        self.weight_decay = float(weight_decay)
        self.steps = 0

    def step(self, params: np.ndarray, grad: np.ndarray, lr: float, scale: float = 1.0,
             check: bool = False, grad2: np.ndarray | None = None) -> bool:
        """One step on ``params`` in place with ``scale * grad``; counts it in ``steps``.

        With ``grad2`` the gradient is ``grad + grad2``, summed in the same
        pass (a bsp server's last two pushes of a clock).  With ``check`` the
        gradient is checked for NaN/Inf in the same pass: False means one was
        found, and ``params`` and the state are then garbage (a caller that
        must keep them checks first).  Otherwise True.
        """
        _check_slices(params, grad, self.n, grad2)
        self.steps += 1
        return self._step(params, grad, None, float(lr), float(scale), check, grad2, self.steps)

    def step_into(self, src: np.ndarray, grad: np.ndarray, dst: np.ndarray, lr: float,
                  scale: float = 1.0, grad2: np.ndarray | None = None) -> bool:
        """One step from ``src`` into ``dst`` (``src`` only read unless it is ``dst``); checks ``grad``.

        The per-element state is updated in place; ``steps`` is not advanced
        (the caller does, once the step is accepted; adam steps as
        ``steps + 1``).  Returns False when the gradient (``grad + grad2`` with
        ``grad2``) holds NaN/Inf; ``dst`` and the state are then garbage.
        """
        _check_slices(src, grad, self.n, grad2, dst)
        dst = None if dst is src else dst   # the kernel's in-place form vectorizes
        return self._step(src, grad, dst, float(lr), float(scale), True, grad2, self.steps + 1)

    def _step(self, src, grad, dst, lr, scale, check, grad2, step) -> bool:
        """The kernel call: read ``src``, write ``dst`` (``src`` when None); ``step`` 1-based."""
        raise NotImplementedError

    def state_dict(self) -> dict:
        state = {key: getattr(self, key) for key in self.state_keys}
        state["steps"] = self.steps
        return state

    def load_state_dict(self, state: dict) -> None:
        for key in self.state_keys:
            value = np.asarray(state[key], dtype=self.dtype)
            if value.shape != (self.n,):
                raise ValueError(f"{self.name} state {key!r} has shape {value.shape}, "
                                 f"expected ({self.n},)")
            getattr(self, key)[:] = value
        self.steps = int(state.get("steps", 0))


class SGD(Optimizer):
    """Plain SGD with L2 weight decay; stateless, so it also works under hogwild."""

    name = "sgd"

    def _step(self, src, grad, dst, lr, scale, check, grad2, step):
        from psgd.kernels.optim import sgd_step
        return sgd_step(src, grad, dst, lr, self.weight_decay, scale, check, grad2)


class Momentum(SGD):
    """Heavy-ball momentum, or Nesterov's variant with ``nesterov=True``."""

    name = "momentum"
    state_keys = ("velocity",)

    def __init__(self, n, momentum=0.9, nesterov=False, weight_decay=0.0, dtype=np.float32):
        super().__init__(n, weight_decay, dtype)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.momentum = float(momentum)
        self.nesterov = bool(nesterov)
        self.name = "nesterov" if nesterov else "momentum"
        self.velocity = np.zeros(self.n, dtype=self.dtype)

    def _step(self, src, grad, dst, lr, scale, check, grad2, step):
        from psgd.kernels.optim import momentum_step
        return momentum_step(src, grad, self.velocity, dst, lr, self.momentum, self.weight_decay,
                             self.nesterov, scale, check, grad2)


class Adagrad(Optimizer):
    """AdaGrad: per-coordinate steps ``lr / (sqrt(sum of squared gradients) + eps)``."""

    name = "adagrad"
    state_keys = ("acc",)

    def __init__(self, n, eps=ADAGRAD_EPS, initial_accumulator=ADAGRAD_INITIAL, weight_decay=0.0,
                 dtype=np.float32):
        super().__init__(n, weight_decay, dtype)
        if eps <= 0:
            raise ValueError(f"adagrad eps must be > 0, got {eps}")
        if initial_accumulator < 0:
            raise ValueError(f"adagrad's initial accumulator must be >= 0, got {initial_accumulator}")
        self.eps = float(eps)
        self.acc = np.full(self.n, initial_accumulator, dtype=self.dtype)

    def _step(self, src, grad, dst, lr, scale, check, grad2, step):
        from psgd.kernels.optim import adagrad_step
        return adagrad_step(src, grad, self.acc, dst, lr, self.eps, self.weight_decay, scale,
                            check, grad2)


class Adam(Optimizer):
    """Adam with bias correction and decoupled weight decay (AdamW)."""

    name = "adam"
    state_keys = ("m", "v")

    def __init__(self, n, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, dtype=np.float32):
        super().__init__(n, weight_decay, dtype)
        for label, beta in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"adam {label} must be in [0, 1), got {beta}")
        if eps <= 0:
            raise ValueError(f"adam eps must be > 0, got {eps}")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)
        self.m = np.zeros(self.n, dtype=self.dtype)
        self.v = np.zeros(self.n, dtype=self.dtype)

    def _step(self, src, grad, dst, lr, scale, check, grad2, step):
        from psgd.kernels.optim import adam_step
        return adam_step(src, grad, self.m, self.v, dst, lr, self.beta1, self.beta2, self.eps,
                         self.weight_decay, step, scale, check, grad2)


def make_optimizer(name: str, n: int, *, momentum: float = 0.9, weight_decay: float = 0.0,
                   beta1: float = 0.9, beta2: float = 0.999, eps: float | None = None,
                   initial_accumulator: float = ADAGRAD_INITIAL, dtype=np.float32) -> Optimizer:
    """Build optimizer ``name`` (one of :data:`OPTIMIZERS`) for a slice of ``n`` parameters
    of ``dtype`` (its per-element state in the same dtype)."""
    if name == "sgd":
        return SGD(n, weight_decay=weight_decay, dtype=dtype)
    if name in ("momentum", "nesterov"):
        return Momentum(n, momentum=momentum, nesterov=(name == "nesterov"),
                        weight_decay=weight_decay, dtype=dtype)
    if name == "adagrad":
        return Adagrad(n, eps=ADAGRAD_EPS if eps is None else eps,
                       initial_accumulator=initial_accumulator, weight_decay=weight_decay,
                       dtype=dtype)
    if name == "adam":
        return Adam(n, beta1=beta1, beta2=beta2, eps=1e-8 if eps is None else eps,
                    weight_decay=weight_decay, dtype=dtype)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def optimal_t0(alpha: float, loss: str = "log") -> float:
    """scikit-learn's ``optimal_init`` (Bottou's heuristic), as its ``_plain_sgd`` computes it:
    ``typw = sqrt(1 / sqrt(alpha))``, ``eta0 = typw / max(1, dloss(-typw, 1))``,
    ``t0 = 1 / (eta0 * alpha)``, with ``dloss`` the derivative of the binary ``log`` or
    ``hinge`` loss in the score; so that ``1 / (alpha * t0)`` is the first rate."""
    if not (alpha > 0 and math.isfinite(alpha)):
        raise ValueError(f"--alpha must be a positive number, got {alpha}")
    typw = math.sqrt(1.0 / math.sqrt(alpha))
    p, y = -typw, 1.0
    if loss == "log":
        z = p * y
        dloss = -y * math.exp(-z) if z > 18.0 else -y if z < -18.0 else -y / (math.exp(z) + 1.0)
    elif loss == "hinge":
        dloss = -y if p * y <= 1.0 else 0.0
    else:
        raise ValueError(f"unknown loss {loss!r} for the optimal schedule; log or hinge")
    return 1.0 / (typw / max(1.0, dloss) * alpha)


def make_schedule(kind: str, lr: float, total_steps: int, *, warmup: int = 0,
                  step_every: int = 0, gamma: float = 0.1, min_lr: float = 0.0,
                  alpha: float = DEFAULT_ALPHA, t0: float | None = None) -> Callable[[int], float]:
    """Learning rate as a function of the 0-based step.

    ``constant``; ``step`` (multiply by ``gamma`` every ``step_every`` steps);
    ``cosine`` (from ``lr`` down to ``min_lr`` over ``total_steps``); ``inverse-sqrt``
    (``lr / sqrt(1 + step)``, scikit-learn's ``invscaling`` at ``power_t = 0.5``); each with an
    optional linear warm-up over the first ``warmup`` steps. ``optimal``:
    ``1 / (alpha * (t0 + step))`` (scikit-learn's, ``t0`` default :func:`optimal_t0`), ``lr``
    and ``warmup`` unused.
    """
    if kind == "optimal":
        t0 = optimal_t0(alpha) if t0 is None else float(t0)
        if not t0 > 1:
            raise ValueError(f"the optimal schedule needs t0 > 1 (lr * alpha < 1), got {t0}")
        return lambda step: 1.0 / (alpha * (t0 + step))
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"learning rate must be a positive finite number, got {lr}")
    if warmup < 0:
        raise ValueError(f"warm-up steps must be >= 0, got {warmup}")
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    if kind == "step" and step_every <= 0:
        raise ValueError("the step schedule needs --lr-step-every > 0")
    total = max(int(total_steps), 1)

    def schedule(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        if kind == "step":
            return lr * gamma ** (step // step_every)
        if kind == "inverse-sqrt":
            return lr / math.sqrt(1.0 + step - warmup)
        if kind == "cosine":
            t = min(max(step - warmup, 0) / max(total - warmup, 1), 1.0)
            return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * t))
        return lr

    return schedule
