"""Gradient compression kernels: encode a float32 slice into bytes, decode and add it back.

Each pair works on one contiguous slice (a server's shard), so a shard
decodes alone. Byte layouts are little-endian and documented per pair;
``psgd.compress`` wraps them with a header and the error-feedback residual.
"""
from __future__ import annotations

import numpy as np
from numba import njit


# ---------------------------------------------------------------- fp16

_F16_MAX = (127 + 16) << 23          # the first float32 that rounds to infinity in half
_F32_INF = 255 << 23
_DENORM_MAGIC = ((127 - 15) + (23 - 10) + 1) << 23


@njit(cache=True)
def fp16_encode(grad, out):
    """IEEE half precision, round to nearest even (as numpy's ``astype(float16)``).

    F. Giesen's branch-light float -> half conversion (public domain).
    Layout: n uint16 (little-endian). Returns the bytes written.
    """
    n = grad.shape[0]
    bits = grad.view(np.uint32)
    half = out[:2 * n].view(np.uint16)
    magic = np.array([_DENORM_MAGIC], np.uint32).view(np.float32)[0]
    for i in range(n):
        f = bits[i]
        sign = f & np.uint32(0x80000000)
        f ^= sign
        if f >= _F16_MAX:
            o = np.uint32(0x7E00) if f > _F32_INF else np.uint32(0x7C00)
        elif f < (113 << 23):      # a half subnormal or zero: let float addition round it
            v = np.array([f], np.uint32).view(np.float32)[0] + magic
            o = np.array([v], np.float32).view(np.uint32)[0] - np.uint32(_DENORM_MAGIC)
        else:
            odd = (f >> 13) & np.uint32(1)
            f += np.uint32(((15 - 127) << 23) + 0xFFF) + odd
            o = f >> 13
        half[i] = np.uint16(o | (sign >> 16))
    return 2 * n


def _half_table():
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(
        np.float32)


HALF_TO_FLOAT = _half_table()   # every half value as float32 (256 KB): decoding is a lookup


@njit(cache=True)
def fp16_decode_add(buf, table, dst):
    """``dst += decode(buf)`` for :func:`fp16_encode`'s layout (``table``: :data:`HALF_TO_FLOAT`)."""
    half = buf[:2 * dst.shape[0]].view(np.uint16)
    for i in range(dst.shape[0]):
        dst[i] += table[half[i]]


# ---------------------------------------------------------------- qsgd


LANES = 4   # qsgd's xorshift64 streams: element i of a bucket draws from stream i % LANES


@njit(cache=True, inline="always")
def _xorshift(x):
    x ^= x << np.uint64(13)
    x ^= x >> np.uint64(7)
    x ^= x << np.uint64(17)
    return x


@njit(cache=True, inline="always")
def _qsgd_code(g, scale, s, x):
    """The code ``level + s`` (or ``s - level``) of ``g``, rounded up with probability from ``x``."""
    u = np.float32(x >> np.uint64(40)) * np.float32(1.0 / (1 << 24))
    level = min(s, int(abs(g) * scale + u))
    return s + level if g >= 0 else s - level


@njit(cache=True)
def _sum_squares(grad, lo, hi, q):
    """The sum of squares of ``grad[lo:hi]``, added in LANES partial sums (``q``: scratch)."""
    q[:] = 0.0
    m = hi - lo
    i = 0
    while i + LANES <= m:
        for k in range(LANES):
            q[k] += grad[lo + i + k] * grad[lo + i + k]
        i += LANES
    for k in range(m - i):
        q[k] += grad[lo + i + k] * grad[lo + i + k]
    return (q[0] + q[1]) + (q[2] + q[3])


@njit(cache=True)
def _codes(grad, lo, hi, scale, s, streams, level):
    """``level[:hi - lo]`` = the codes of ``grad[lo:hi]``, element i drawing from
    ``streams[i % LANES]`` (advanced in place)."""
    x0, x1, x2, x3 = streams[0], streams[1], streams[2], streams[3]
    m = hi - lo
    i = 0
    while i + LANES <= m:
        x0, x1, x2, x3 = _xorshift(x0), _xorshift(x1), _xorshift(x2), _xorshift(x3)
        level[i] = _qsgd_code(grad[lo + i], scale, s, x0)
        level[i + 1] = _qsgd_code(grad[lo + i + 1], scale, s, x1)
        level[i + 2] = _qsgd_code(grad[lo + i + 2], scale, s, x2)
        level[i + 3] = _qsgd_code(grad[lo + i + 3], scale, s, x3)
        i += LANES
    if i < m:
        x0 = _xorshift(x0)
        level[i] = _qsgd_code(grad[lo + i], scale, s, x0)
    if i + 1 < m:
        x1 = _xorshift(x1)
        level[i + 1] = _qsgd_code(grad[lo + i + 1], scale, s, x1)
    if i + 2 < m:
        x2 = _xorshift(x2)
        level[i + 2] = _qsgd_code(grad[lo + i + 2], scale, s, x2)
    streams[0], streams[1], streams[2], streams[3] = x0, x1, x2, x3


@njit(cache=True)
def qsgd_encode(grad, bits, bucket, out, state):
    """QSGD: per bucket its L2 norm, per element a signed level in {-s..s}, s = 2**(bits-1) - 1.

    Layout: ``ceil(n / bucket)`` float32 norms, then the levels as ``bits``-bit
    codes ``level + s``, packed from the low bits of each byte up (a code may
    straddle two bytes). A level is ``floor(|g| / norm * s + u)`` with u
    uniform in [0, 1) (the top 24 bits of a draw), element i of a bucket
    drawing from xorshift64 stream ``state[i % LANES]`` (uint64 (LANES,); the
    streams are independent chains the CPU runs side by side), so the decoded
    value ``norm * level / s`` is unbiased. Returns the bytes written.
    """
    n = grad.shape[0]
    nb = (n + bucket - 1) // bucket
    norms = out[:4 * nb].view(np.float32)
    s = (1 << (bits - 1)) - 1
    codes = out[4 * nb:]
    nbytes = (n * bits + 7) // 8
    level = np.empty(min(bucket, n), np.uint8)
    q = np.zeros(LANES, np.float32)
    acc = np.uint64(0)      # bits not yet written, low first; fewer than 8 between codes
    held = 0
    j = 0
    for b in range(nb):
        lo, hi = b * bucket, min(n, (b + 1) * bucket)
        norm = np.float32(np.sqrt(_sum_squares(grad, lo, hi, q)))
        norms[b] = norm
        scale = np.float32(s) / norm if norm > 0 else np.float32(0.0)
        _codes(grad, lo, hi, scale, s, state, level)
        if bits == 4 and held == 0 and (hi - lo) % 2 == 0:   # two codes a byte, from its start
            for i in range(0, hi - lo, 2):
                codes[j] = level[i] | (level[i + 1] << 4)
                j += 1
            continue
        for i in range(hi - lo):
            acc |= np.uint64(level[i]) << np.uint64(held)
            held += bits
            if held >= 8:
                codes[j] = np.uint8(acc & np.uint64(0xFF))
                acc >>= np.uint64(8)
                held -= 8
                j += 1
    if held > 0:
        codes[j] = np.uint8(acc & np.uint64(0xFF))
    return 4 * nb + nbytes


@njit(cache=True)
def qsgd_decode_add(buf, bits, bucket, dst):
    """``dst += decode(buf)`` for :func:`qsgd_encode`'s layout (``dst``'s length is n)."""
    n = dst.shape[0]
    nb = (n + bucket - 1) // bucket
    norms = buf[:4 * nb].view(np.float32)
    codes = buf[4 * nb:]
    s = (1 << (bits - 1)) - 1
    mask = np.uint64((1 << bits) - 1)
    table = np.empty(1 << bits, np.float32)
    acc = np.uint64(0)
    held = 0
    j = 0
    for b in range(nb):
        lo, hi = b * bucket, min(n, (b + 1) * bucket)
        step = norms[b] / np.float32(s)
        for c in range(1 << bits):
            table[c] = np.float32(c - s) * step
        if bits == 4 and held == 0 and (hi - lo) % 2 == 0:   # two codes a byte
            for i in range(lo, hi, 2):
                byte = codes[j]
                dst[i] += table[byte & 15]
                dst[i + 1] += table[byte >> 4]
                j += 1
            continue
        for i in range(lo, hi):
            if held < bits:
                acc |= np.uint64(codes[j]) << np.uint64(held)
                held += 8
                j += 1
            dst[i] += table[acc & mask]
            acc >>= np.uint64(bits)
            held -= bits


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
        total = np.float32(0.0)
        for i in range(lo, hi):
            total += abs(grad[i])
        scales[b] = total / np.float32(hi - lo)
    full = n // 8
    for j in range(full):
        byte = 0
        for k in range(8):
            byte |= (grad[8 * j + k] >= 0) << k
        bits[j] = byte
    if n > 8 * full:
        byte = 0
        for k in range(n - 8 * full):
            byte |= (grad[8 * full + k] >= 0) << k
        bits[full] = byte
    return 4 * nb + (n + 7) // 8


@njit(cache=True)
def sign_decode_add(buf, bucket, dst):
    """``dst += decode(buf)`` for :func:`sign_encode`'s layout."""
    n = dst.shape[0]
    nb = (n + bucket - 1) // bucket
    scales = buf[:4 * nb].view(np.float32)
    bits = buf[4 * nb:]
    for b in range(nb):
        lo, hi = b * bucket, min(n, (b + 1) * bucket)
        scale = scales[b]
        for i in range(lo, hi):
            dst[i] += scale * np.float32(2 * ((bits[i >> 3] >> (i & 7)) & 1) - 1)


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
