"""A plain numpy model for protocol tests: linear softmax regression and its gradient."""
import numpy as np


def softmax_grad(params, x, y, n_classes):
    """Gradient (float32, like ``params``) of the mean cross-entropy of softmax(x @ W + b).

    ``params`` holds W (D x C, row-major) then b (C,); ``x`` is (B, D), ``y`` (B,) class ids.
    The sums run in float64, so the result does not depend on the BLAS in use.
    """
    d = x.shape[1]
    p = params.astype(np.float64)
    w, b = p[:d * n_classes].reshape(d, n_classes), p[d * n_classes:]
    logits = x @ w + b
    logits -= logits.max(axis=1, keepdims=True)
    prob = np.exp(logits)
    prob /= prob.sum(axis=1, keepdims=True)
    prob[np.arange(len(y)), y] -= 1.0
    prob /= len(y)
    return np.concatenate([(x.T @ prob).ravel(), prob.sum(axis=0)]).astype(np.float32)
