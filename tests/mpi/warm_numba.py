"""Compile, once and in one process, the numba kernels most ranks of the suite call (the small
MLP's layers and loss, every optimizer, the finite check), filling the on-disk cache the
ranks then load instead of each compiling the same functions side by side."""
import sys

import numpy as np

from psgd.nn.model import build_model
from psgd.nn.optim import make_optimizer


def main(specs):
    rng = np.random.default_rng(0)
    for spec in specs:
        model = build_model(spec)
        x = rng.integers(0, 256, (16, 1, 28, 28)).astype(np.uint8)
        y = rng.integers(0, 10, 16)
        model.loss_and_grad(x, y)
        model.evaluate(x, y)
        for name in ("sgd", "momentum", "nesterov", "adam"):
            make_optimizer(name, model.n_params).step(model.params, model.grad, 0.01)


if __name__ == "__main__":
    main(sys.argv[1:] or ["mlp:784-32-10"])
