"""Top-k compression kernels: the largest magnitudes of a float32 slice as index + value,
and their decode-and-add (the byte layout is :func:`topk_encode`'s)."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def topk_threshold(grad, k, sample):
    """A magnitude t with about ``2 k`` elements of ``grad`` at or above it, from a strided
    sample of ``sample`` elements (0 when k covers most of the slice)."""
    n = grad.shape[0]
    if 4 * k >= n or n <= sample:
        return np.float32(0.0)
    stride = n // sample
    mags = np.empty(sample, np.float32)
    for j in range(sample):
        mags[j] = abs(grad[j * stride])
    want = min(sample - 1, max(0, sample - 1 - (2 * k * sample) // n))
    return np.partition(mags, want)[want]


@njit(cache=True)
def topk_encode(grad, k, out, threshold):
    """The ``k`` largest magnitudes of ``grad`` as int32 indices then float32 values.

    Candidates are the elements at or above ``threshold``; when fewer than
    ``k`` pass it, every element is a candidate. Ties at the cut keep the
    lowest indices. Layout: int32 count m (= min(k, n)), m int32 indices in
    increasing order, m float32 values. Returns the bytes written.
    """
    n = grad.shape[0]
    k = min(k, n)
    count = 0
    for i in range(n):
        if abs(grad[i]) >= threshold:
            count += 1
    if count < k:
        threshold, count = np.float32(-1.0), n
    cand = np.empty(count, np.int64)
    mags = np.empty(count, np.float32)
    c = 0
    for i in range(n):
        a = abs(grad[i])
        if a >= threshold:
            cand[c] = i
            mags[c] = a
            c += 1
    out[:4].view(np.int32)[0] = k
    idx = out[4:4 + 4 * k].view(np.int32)
    vals = out[4 + 4 * k:4 + 8 * k].view(np.float32)
    if k == 0:
        return 4
    cut = -np.partition(-mags, k - 1)[k - 1]     # the k-th largest candidate magnitude
    above = 0
    for j in range(count):
        if mags[j] > cut:
            above += 1
    ties = k - above                                  # how many at the cut to keep
    m = 0
    for j in range(count):
        if mags[j] > cut or (mags[j] == cut and ties > 0):
            if mags[j] == cut:
                ties -= 1
            idx[m] = cand[j]
            vals[m] = grad[cand[j]]
            m += 1
    return 4 + 8 * k


@njit(cache=True)
def topk_decode_add(buf, dst):
    """``dst[idx] += values`` for :func:`topk_encode`'s layout."""
    k = buf[:4].view(np.int32)[0]
    idx = buf[4:4 + 4 * k].view(np.int32)
    vals = buf[4 + 4 * k:4 + 8 * k].view(np.float32)
    for j in range(k):
        dst[idx[j]] += vals[j]


# ---------------------------------------------------------------- error feedback
