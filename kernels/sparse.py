"""Linear scores over CSR batches (forward beside backward) and the multiclass hinge loss."""
import numpy as np
from numba import njit


@njit(cache=True)
def csr_linear_forward(indptr, indices, values, w, b, out, rows=None):
    """``out = x @ w + b`` for a CSR batch ``x`` (``rows``: sample i is CSR row ``rows[i]``).

    Parameters
    ----------
    indptr : (B + 1,) int64
    indices : (nnz,) int32 feature ids in ``[0, D)`` (not checked here)
    values : (nnz,) float32
    w : (D, K) float32 or float64
    b : (K,) same dtype
    out : (B, K) same dtype, overwritten
    """
    n, k = out.shape
    for i in range(n):
        r = i if rows is None else rows[i]
        for c in range(k):
            out[i, c] = b[c]
        for p in range(indptr[r], indptr[r + 1]):
            row, v = indices[p], values[p]
            for c in range(k):
                out[i, c] += v * w[row, c]


@njit(cache=True)
def csr_linear_backward(indptr, indices, values, dout, gw, gb, rows=None):
    """Add ``x.T @ dout`` into the rows of ``gw`` that ``x`` touches and set ``gb = dout.sum(0)``
    (``rows``: sample i is CSR row ``rows[i]``).

    ``gw`` (D, K) must be zero on the touched rows beforehand (see :func:`zero_rows`);
    rows no sample touches are left as they are.
    """
    n, k = dout.shape
    for c in range(k):
        gb[c] = 0.0
    for i in range(n):
        r = i if rows is None else rows[i]
        for c in range(k):
            gb[c] += dout[i, c]
        for p in range(indptr[r], indptr[r + 1]):
            row, v = indices[p], values[p]
            for c in range(k):
                gw[row, c] += v * dout[i, c]


@njit(cache=True)
def zero_rows(a, rows):
    """``a[rows] = 0`` for a 2-d array ``a`` and int64 row ids ``rows``."""
    k = a.shape[1]
    for r in rows:
        for c in range(k):
            a[r, c] = 0.0


@njit(cache=True)
def touched_rows(indices, n_rows, mark):
    """The sorted distinct ids in ``indices`` (int64); ``mark`` (n_rows,) bool scratch, left all False."""
    count = 0
    for j in indices:
        if not mark[j]:
            mark[j] = True
            count += 1
    out = np.empty(count, np.int64)
    m = 0
    for j in indices:
        if mark[j]:
            mark[j] = False
            out[m] = j
            m += 1
    out.sort()
    return out


@njit(cache=True)
def multiclass_hinge(scores, labels, dscores):
    """Mean Crammer-Singer hinge ``max(0, 1 + max_{j != y} s_j - s_y)`` over the batch.

    Parameters
    ----------
    scores : (B, K) float32 or float64
    labels : (B,) int64 class ids in ``[0, K)``
    dscores : (B, K) same dtype, overwritten with the gradient of the mean loss

    Returns
    -------
    loss : float
    n_correct : int
        Rows whose first arg-max equals the label.
    """
    n, k = scores.shape
    total = 0.0
    correct = 0
    inv_n = 1.0 / n
    for i in range(n):
        y = labels[i]
        best = 0
        rival = -1
        for j in range(k):
            dscores[i, j] = 0.0
            if scores[i, j] > scores[i, best]:
                best = j
            if j != y and (rival < 0 or scores[i, j] > scores[i, rival]):
                rival = j
        if best == y:
            correct += 1
        margin = 1.0 + scores[i, rival] - scores[i, y]
        if margin > 0.0:
            total += margin
            dscores[i, rival] = inv_n
            dscores[i, y] = -inv_n
    return total * inv_n, correct


@njit(cache=True)
def nonzero_encode(grad, out):
    """``grad``'s nonzeros as int32 count m, m int32 indices, m float32 values, when that is smaller
    than the slice; else int32 -1 and the n float32 values. Returns the bytes written."""
    n = grad.shape[0]
    m = 0
    for i in range(n):
        if grad[i] != 0:
            m += 1
    if 8 * m >= 4 * n:
        out[:4].view(np.int32)[0] = -1
        out[4:4 + 4 * n].view(np.float32)[:] = grad
        return 4 + 4 * n
    out[:4].view(np.int32)[0] = m
    idx = out[4:4 + 4 * m].view(np.int32)
    vals = out[4 + 4 * m:4 + 8 * m].view(np.float32)
    c = 0
    for i in range(n):
        if grad[i] != 0:
            idx[c] = i
            vals[c] = grad[i]
            c += 1
    return 4 + 8 * m


@njit(cache=True)
def nonzero_decode_add(buf, dst):
    """``dst += decode(buf)`` for :func:`nonzero_encode`'s layout."""
    m = buf[:4].view(np.int32)[0]
    if m < 0:
        dst += buf[4:4 + 4 * dst.shape[0]].view(np.float32)
        return
    idx = buf[4:4 + 4 * m].view(np.int32)
    vals = buf[4 + 4 * m:4 + 8 * m].view(np.float32)
    for j in range(m):
        dst[idx[j]] += vals[j]
