"""Gradient compression kernels: encode a float32 slice into bytes, decode and add it back.

Each pair works on one contiguous slice (a server's shard), so a shard
decodes alone. Byte layouts are little-endian and documented per pair;
``psgd.compress`` wraps them with a header and the error-feedback residual.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def seed(value):
    """Seed numba's generator of this process (qsgd's stochastic rounding)."""
    np.random.seed(value)


# ---------------------------------------------------------------- qsgd


@njit(cache=True)
def qsgd_encode(grad, bits, bucket, out):
    """QSGD: per bucket its L2 norm, per element a signed level in {-s..s}, s = 2**(bits-1) - 1.

    Layout: ``ceil(n / bucket)`` float32 norms, then the levels as ``bits``-bit
    codes ``level + s``, packed little-end first into bytes. A level is
    ``floor(|g| / norm * s + u)`` with u uniform in [0, 1), so the decoded
    value ``norm * level / s`` is unbiased.

    Returns the number of bytes written.
    """
    n = grad.shape[0]
    nb = (n + bucket - 1) // bucket
    norms = out[:4 * nb].view(np.float32)
    s = (1 << (bits - 1)) - 1
    codes = out[4 * nb:]
    nbytes = (n * bits + 7) // 8
    for i in range(nbytes):
        codes[i] = 0
    pos = 0
    for b in range(nb):
        lo, hi = b * bucket, min(n, (b + 1) * bucket)
        sq = 0.0
        for i in range(lo, hi):
            sq += np.float64(grad[i]) * grad[i]
        norm = np.float32(np.sqrt(sq))
        norms[b] = norm
        scale = s / norm if norm > 0 else 0.0
        for i in range(lo, hi):
            g = grad[i]
            level = int(np.floor(abs(g) * scale + np.random.random()))
            if level > s:
                level = s
            code = s + level if g >= 0 else s - level
            byte, shift = pos >> 3, pos & 7
            codes[byte] |= (code << shift) & 0xFF
            if shift + bits > 8:
                codes[byte + 1] |= code >> (8 - shift)
            pos += bits
    return 4 * nb + nbytes


@njit(cache=True)
def qsgd_decode_add(buf, bits, bucket, dst):
    """``dst += decode(buf)`` for :func:`qsgd_encode`'s layout (``dst``'s length is n)."""
    n = dst.shape[0]
    nb = (n + bucket - 1) // bucket
    norms = buf[:4 * nb].view(np.float32)
    codes = buf[4 * nb:]
    s = (1 << (bits - 1)) - 1
    mask = (1 << bits) - 1
    pos = 0
    for b in range(nb):
        lo, hi = b * bucket, min(n, (b + 1) * bucket)
        step = norms[b] / s
        for i in range(lo, hi):
            byte, shift = pos >> 3, pos & 7
            word = np.int32(codes[byte])
            if shift + bits > 8:
                word |= np.int32(codes[byte + 1]) << 8
            code = (word >> shift) & mask
            dst[i] += np.float32((code - s) * step)
            pos += bits


# ---------------------------------------------------------------- sign


@njit(cache=True)
def sign_encode(grad, bucket, out):
    """1 bit per element (set: g >= 0) and per bucket its mean |g| as the scale.

    Layout: ``ceil(n / bucket)`` float32 scales, then ``ceil(n / 8)`` bytes of
    bits, element i at bit ``i % 8`` of byte ``i // 8``. Returns the bytes written.
    """
    n = grad.shape[0]
    nb = (n + bucket - 1) // bucket
    scales = out[:4 * nb].view(np.float32)
    bits = out[4 * nb:]
    for b in range(nb):
        lo, hi = b * bucket, min(n, (b + 1) * bucket)
        total = 0.0
        for i in range(lo, hi):
            total += abs(grad[i])
        scales[b] = total / (hi - lo)
    for j in range((n + 7) // 8):
        byte = 0
        for k in range(min(8, n - 8 * j)):
            if grad[8 * j + k] >= 0:
                byte |= 1 << k
        bits[j] = byte
    return 4 * nb + (n + 7) // 8


@njit(cache=True)
def sign_decode_add(buf, bucket, dst):
    """``dst += decode(buf)`` for :func:`sign_encode`'s layout."""
    n = dst.shape[0]
    nb = (n + bucket - 1) // bucket
    scales = buf[:4 * nb].view(np.float32)
    bits = buf[4 * nb:]
    for i in range(n):
        scale = scales[i // bucket]
        if (bits[i >> 3] >> (i & 7)) & 1:
            dst[i] += scale
        else:
            dst[i] -= scale


# ---------------------------------------------------------------- top-k


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


@njit(cache=True)
def add_residual(grad, residual, out):
    """``out = grad + residual`` (what a compressor with error feedback encodes)."""
    for i in range(grad.shape[0]):
        out[i] = grad[i] + residual[i]
