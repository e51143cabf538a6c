"""Softmax cross-entropy (numerically stable, mean over the batch) with its gradient, and the labels' range check."""
import numpy as np
from numba import njit


@njit(cache=True)
def softmax_cross_entropy(logits, labels, dlogits):
    """Mean softmax cross-entropy over the batch, its gradient, and the correct count.

    Parameters
    ----------
    logits : (B, K) float32 or float64
    labels : (B,) int64 class ids in ``[0, K)`` (not checked here)
    dlogits : (B, K) same dtype as ``logits``, overwritten with
        ``(softmax(logits) - onehot(labels)) / B``, the gradient of the mean loss

    Returns
    -------
    loss : float
        ``mean_i(logsumexp(logits_i) - logits_i[labels_i])``, accumulated in float64.
    n_correct : int
        Number of rows whose first arg-max equals the label.
    """
    n, k = logits.shape
    total = 0.0
    correct = 0
    inv_n = 1.0 / n
    for i in range(n):
        m = logits[i, 0]
        best = 0
        for j in range(1, k):
            if logits[i, j] > m:
                m = logits[i, j]
                best = j
        if best == labels[i]:
            correct += 1
        s = 0.0
        for j in range(k):
            e = np.exp(np.float64(logits[i, j]) - m)
            dlogits[i, j] = e
            s += e
        total += np.log(s) + m - logits[i, labels[i]]
        scale = inv_n / s
        for j in range(k):
            dlogits[i, j] = dlogits[i, j] * scale
        dlogits[i, labels[i]] -= inv_n
    return total * inv_n, correct


@njit(cache=True)
def labels_in_range(labels, k):
    """True when every label is a class id in ``[0, k)`` (one pass, no temporary).

    Parameters
    ----------
    labels : (B,) int64
    k : int, the number of classes

    Returns
    -------
    bool
    """
    bad = False
    for i in range(labels.shape[0]):
        v = labels[i]
        bad |= (v < 0) | (v >= k)
    return not bad
