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


_F16_CHUNK = 256   # elements whose subnormal candidates are computed first


@njit(cache=True)
def fp16_encode(grad, out):
    """IEEE half precision, round to nearest even (as numpy's ``astype(float16)``).

    F. Giesen's branch-light float -> half conversion (public domain), its three
    cases (overflow or NaN, half subnormal, normal) computed for every element and
    selected, a chunk at a time, so that it vectorizes.
    Layout: n uint16 (little-endian). Returns the bytes written.
    """
    n = grad.shape[0]
    bits = grad.view(np.uint32)
    half = out[:2 * n].view(np.uint16)
    magic = np.array([_DENORM_MAGIC], np.uint32).view(np.float32)[0]
    sub = np.empty(_F16_CHUNK, np.float32)
    sub_bits = sub.view(np.uint32)
    for c0 in range(0, n, _F16_CHUNK):
        g, g_bits, h = grad[c0:c0 + _F16_CHUNK], bits[c0:c0 + _F16_CHUNK], half[c0:c0 + _F16_CHUNK]
        for i in range(g.shape[0]):
            sub[i] = abs(g[i]) + magic       # a half subnormal or zero: float addition rounds it
        for i in range(g.shape[0]):
            f = g_bits[i]
            sign = f & np.uint32(0x80000000)
            f ^= sign
            big = np.uint32(0x7E00) if f > _F32_INF else np.uint32(0x7C00)
            small = sub_bits[i] - np.uint32(_DENORM_MAGIC)
            odd = (f >> 13) & np.uint32(1)
            normal = (f - np.uint32(((127 - 15) << 23) - 0xFFF) + odd) >> 13   # mod 2**32
            o = big if f >= _F16_MAX else (small if f < (113 << 23) else normal)
            h[i] = np.uint16(o | (sign >> 16))
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


# ---------------------------------------------------------------- a bucket's sum (qsgd, sign)


_PARTS = 64           # partial sums of a bucket's sum


SUM_ABS, SUM_SQUARES, MAX_ABS = 0, 1, 2    # what _bucket_reduce folds a bucket into


@njit(inline="always")
def _fold(a, v, op):
    """``a`` with one more element ``v`` folded in: added (its magnitude or square) or, for
    MAX_ABS, the larger magnitude (a NaN, once in, stays)."""
    if op == MAX_ABS:
        v = abs(v)
        return v if v >= a or v != v else a
    return a + (v * v if op == SUM_SQUARES else abs(v))


@njit(cache=True)
def _bucket_reduce(x, acc, op):
    """The sum of ``|x|`` or ``x * x``, or the largest ``|x|`` (``op``): element i into
    ``acc[i % 64]`` (float32 (64,)), then the 64 combined pairwise (acc[k] with acc[k + 32],
    then + 16, ...): a fixed order that the loop vectorizer keeps (no fastmath: the compiled
    result is the Python one). A NaN anywhere gives NaN."""
    acc[:] = 0.0
    m = x.shape[0]
    full = m - m % _PARTS
    for i in range(0, full, _PARTS):
        xi = x[i:i + _PARTS]
        for k in range(_PARTS):
            acc[k] = _fold(acc[k], xi[k], op)
    for k in range(m - full):
        acc[k] = _fold(acc[k], x[full + k], op)
    w = _PARTS
    while w > 1:
        w //= 2
        for k in range(w):
            # a partial result is already a magnitude (or a sum of squares): add it as is
            acc[k] = _fold(acc[k], acc[k + w], op if op == MAX_ABS else SUM_ABS)
    return acc[0]


@njit(cache=True)
def _bucket_norm(x, acc, maxnorm):
    """qsgd's scale of a bucket: its largest magnitude (``maxnorm``) or its L2 norm."""
    return (_bucket_reduce(x, acc, MAX_ABS) if maxnorm
            else np.float32(np.sqrt(_bucket_reduce(x, acc, SUM_SQUARES))))


# ---------------------------------------------------------------- qsgd


LANES = 32            # qsgd's xorshift64 streams, advanced together once per chunk
CHUNK = 2 * LANES     # elements per chunk: each stream's draw gives two uniforms


@njit(cache=True, inline="always")
def _xorshift(x):
    x ^= x << np.uint64(13)
    x ^= x >> np.uint64(7)
    x ^= x << np.uint64(17)
    return x


@njit(cache=True)
def _uniforms(state, ubits):
    """Advance every stream once; ``ubits`` (uint32 (CHUNK,)) = the bits of floats in [1, 2)
    whose 23-bit mantissas are draw k's bits 9..31 (element k) and 41..63 (element LANES + k)."""
    one = np.uint32(0x3F800000)
    for k in range(LANES):
        x = _xorshift(state[k])
        state[k] = x
        ubits[k] = np.uint32((x >> np.uint64(9)) & np.uint64(0x7FFFFF)) | one
        ubits[LANES + k] = np.uint32(x >> np.uint64(41)) | one


@njit(cache=True)
def _codes(x, scale, s, state, ubits, code):
    """``code[:m]`` = the codes ``s + level`` (g >= 0) or ``s - level`` of ``x`` (m elements),
    level = ``min(s, floor(|g| * scale + u))``, u from :func:`_uniforms` for each CHUNK."""
    u = ubits.view(np.float32)
    sf = np.float32(s)
    one = np.float32(1.0)
    m = x.shape[0]
    full = m - m % CHUNK
    for c0 in range(0, full, CHUNK):
        _uniforms(state, ubits)
        xc, cc = x[c0:c0 + CHUNK], code[c0:c0 + CHUNK]
        for i in range(CHUNK):
            g = xc[i]
            level = min(sf, np.floor(abs(g) * scale + (u[i] - one)))
            cc[i] = np.uint8(sf + level if g >= 0 else sf - level)
    if full < m:
        _uniforms(state, ubits)
        for i in range(m - full):
            g = x[full + i]
            level = min(sf, np.floor(abs(g) * scale + (u[i] - one)))
            code[full + i] = np.uint8(sf + level if g >= 0 else sf - level)


@njit(cache=True)
def _binary_flags(x, half_scale, state, ubits, flag):
    """``flag[:m]`` = 1 with probability ``1/2 + x * half_scale`` (else 0), i.e. where
    ``x * half_scale + u >= 1/2``, u from :func:`_uniforms` for each CHUNK as in :func:`_codes`."""
    u = ubits.view(np.float32)
    one, half = np.float32(1.0), np.float32(0.5)
    m = x.shape[0]
    for c0 in range(0, m, CHUNK):
        _uniforms(state, ubits)
        xc, fc = x[c0:c0 + CHUNK], flag[c0:c0 + CHUNK]
        for i in range(xc.shape[0]):
            fc[i] = np.uint8(xc[i] * half_scale + (u[i] - one) >= half)


@njit(cache=True)
def _pack_flags(flag, lo, packed):
    """OR ``flag`` (uint8 0/1 (m,)) into ``packed`` as bits lo..lo + m - 1 (bit k at bit
    ``k % 8`` of byte ``k // 8``); the bytes touched must start zero or hold earlier bits."""
    m = flag.shape[0]
    i = 0
    while i < m and (lo + i) & 7:
        packed[(lo + i) >> 3] |= flag[i] << ((lo + i) & 7)
        i += 1
    whole = (m - i) >> 3
    base = (lo + i) >> 3
    f = flag[i:i + 8 * whole]
    for j in range(whole):
        packed[base + j] = (f[8 * j] | (f[8 * j + 1] << 1) | (f[8 * j + 2] << 2)
                            | (f[8 * j + 3] << 3) | (f[8 * j + 4] << 4) | (f[8 * j + 5] << 5)
                            | (f[8 * j + 6] << 6) | (f[8 * j + 7] << 7))
    for i in range(i + 8 * whole, m):
        packed[(lo + i) >> 3] |= flag[i] << ((lo + i) & 7)


@njit(cache=True)
def qsgd_binary_encode(grad, bucket, out, state, maxnorm=False):
    """qsgd:1: per bucket its norm (:func:`_bucket_norm`), per element one bit, set (decoded
    +norm) with probability ``(1 + g / norm) / 2``, else clear (-norm): unbiased, one level
    and no zero.

    Layout: :func:`qsgd_encode`'s with ``bits`` = 1 (a clear bit is code 0), which is
    :func:`sign_encode`'s with the norm as the scale. Returns the bytes written.
    """
    n = grad.shape[0]
    nb = (n + bucket - 1) // bucket
    norms = out[:4 * nb].view(np.float32)
    packed = out[4 * nb:4 * nb + (n + 7) // 8]
    packed[:] = 0
    flag = np.empty(min(bucket, n), np.uint8)
    acc = np.zeros(_PARTS, np.float32)
    ubits = np.empty(CHUNK, np.uint32)
    for b in range(nb):
        x = grad[b * bucket:min(n, (b + 1) * bucket)]
        norm = _bucket_norm(x, acc, maxnorm)
        norms[b] = norm
        half_scale = np.float32(0.5) / norm if norm > 0 else np.float32(0.0)
        _binary_flags(x, half_scale, state, ubits, flag[:x.shape[0]])
        _pack_flags(flag[:x.shape[0]], b * bucket, packed)
    return 4 * nb + (n + 7) // 8


@njit(cache=True)
def qsgd_encode(grad, bits, bucket, out, state, maxnorm=False):
    """QSGD: per bucket its norm (:func:`_bucket_norm`), per element a signed level in
    {-s..s}, s = 2**(bits-1) - 1.

    Layout: ``ceil(n / bucket)`` float32 norms, then the levels as ``bits``-bit
    codes ``level + s``, packed from the low bits of each byte up (a code may
    straddle two bytes). A level is ``floor(|g| / norm * s + u)`` with u
    uniform in [0, 1) on a grid of 2**-23, so the decoded value
    ``norm * level / s`` is unbiased up to float32 rounding (a level's mean is
    within 2**-23 (1 + a / 2) of a = |g| / norm * s). A bucket's elements go
    in chunks of CHUNK; a chunk advances each of the LANES xorshift64 streams
    ``state`` (uint64 (LANES,)) once, element k of the chunk taking a half of
    stream ``k % LANES``'s draw (see :func:`_uniforms`). ``bits`` = 1 is
    :func:`qsgd_binary_encode`. Returns the bytes written.
    """
    if bits == 1:
        return qsgd_binary_encode(grad, bucket, out, state, maxnorm)
    n = grad.shape[0]
    nb = (n + bucket - 1) // bucket
    norms = out[:4 * nb].view(np.float32)
    s = (1 << (bits - 1)) - 1
    codes = out[4 * nb:]
    nbytes = (n * bits + 7) // 8
    level = np.empty(min(bucket, n), np.uint8)
    acc = np.zeros(_PARTS, np.float32)
    ubits = np.empty(CHUNK, np.uint32)
    held_bits = np.uint64(0)      # bits not yet written, low first; fewer than 8 between codes
    held = 0
    j = 0
    for b in range(nb):
        x = grad[b * bucket:min(n, (b + 1) * bucket)]
        m = x.shape[0]
        norm = _bucket_norm(x, acc, maxnorm)
        norms[b] = norm
        scale = np.float32(s) / norm if norm > 0 else np.float32(0.0)
        if bits == 8:                                  # a code a byte, straight into the frame
            _codes(x, scale, s, state, ubits, codes[j:j + m])
            j += m
            continue
        _codes(x, scale, s, state, ubits, level)
        if bits == 4 and held == 0 and m % 2 == 0:    # two codes a byte, from its start
            pairs = codes[j:j + m // 2]
            for i in range(m // 2):
                pairs[i] = level[2 * i] | (level[2 * i + 1] << 4)
            j += m // 2
            continue
        for i in range(m):
            held_bits |= np.uint64(level[i]) << np.uint64(held)
            held += bits
            if held >= 8:
                codes[j] = np.uint8(held_bits & np.uint64(0xFF))
                held_bits >>= np.uint64(8)
                held -= 8
                j += 1
    if held > 0:
        codes[j] = np.uint8(held_bits & np.uint64(0xFF))
    return 4 * nb + nbytes


@njit(cache=True)
def qsgd_decode_add(buf, bits, bucket, dst):
    """``dst += decode(buf)`` for :func:`qsgd_encode`'s layout (``dst``'s length is n):
    element i gains ``(code - s) * (norm / s)``, or ``+-norm`` for ``bits`` = 1."""
    if bits == 1:
        sign_decode_add(buf, bucket, dst)
        return
    n = dst.shape[0]
    nb = (n + bucket - 1) // bucket
    norms = buf[:4 * nb].view(np.float32)
    codes = buf[4 * nb:]
    s = (1 << (bits - 1)) - 1
    sf = np.float32(s)
    mask = np.uint64((1 << bits) - 1)
    held_bits = np.uint64(0)
    held = 0
    j = 0
    for b in range(nb):
        d = dst[b * bucket:min(n, (b + 1) * bucket)]
        m = d.shape[0]
        step = norms[b] / sf
        if bits == 8:                                  # a code a byte
            c = codes[j:j + m]
            for i in range(m):
                d[i] += (np.float32(c[i]) - sf) * step
            j += m
            continue
        if bits == 4 and held == 0 and m % 2 == 0:    # two codes a byte
            c = codes[j:j + m // 2]
            for i in range(m // 2):
                d[2 * i] += (np.float32(c[i] & 15) - sf) * step
                d[2 * i + 1] += (np.float32(c[i] >> 4) - sf) * step
            j += m // 2
            continue
        for i in range(m):
            if held < bits:
                held_bits |= np.uint64(codes[j]) << np.uint64(held)
                held += 8
                j += 1
            d[i] += (np.float32(held_bits & mask) - sf) * step
            held_bits >>= np.uint64(bits)
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
    acc = np.zeros(_PARTS, np.float32)
    for b in range(nb):
        x = grad[b * bucket:min(n, (b + 1) * bucket)]
        scales[b] = _bucket_reduce(x, acc, SUM_ABS) / np.float32(x.shape[0])
    full = n // 8
    whole = grad[:8 * full]
    for j in range(full):
        byte = 0
        for k in range(8):
            byte |= (whole[8 * j + k] >= 0) << k
        bits[j] = byte
    if n > 8 * full:
        byte = 0
        for k in range(n - 8 * full):
            byte |= (grad[8 * full + k] >= 0) << k
        bits[full] = byte
    return 4 * nb + (n + 7) // 8


@njit(cache=True)
def sign_decode_add(buf, bucket, dst):
    """``dst += decode(buf)`` for :func:`sign_encode`'s layout. A bucket starting on a byte
    spreads each byte's bits to the bytes of a uint64 (b * 0x0101.. & 0x8040..), then adds
    ``+-scale`` per element from those."""
    n = dst.shape[0]
    nb = (n + bucket - 1) // bucket
    scales = buf[:4 * nb].view(np.float32)
    bits = buf[4 * nb:]
    spread = np.empty((min(bucket, n) + 7) // 8, np.uint64)
    flags = spread.view(np.uint8)              # byte i: nonzero where element i's bit is set
    for b in range(nb):
        lo = b * bucket
        d = dst[lo:min(n, lo + bucket)]
        m = d.shape[0]
        scale = scales[b]
        if lo % 8 == 0:
            own = bits[lo >> 3:(lo + m + 7) >> 3]
            for j in range(own.shape[0]):
                spread[j] = ((np.uint64(own[j]) * np.uint64(0x0101010101010101))
                             & np.uint64(0x8040201008040201))
            for i in range(m):
                d[i] += scale * (np.float32(1.0) if flags[i] != 0 else np.float32(-1.0))
            continue
        for i in range(m):
            k = lo + i
            set_ = (bits[k >> 3] >> (k & 7)) & 1
            d[i] += scale * (np.float32(1.0) if set_ else np.float32(-1.0))


@njit(cache=True)
def add_residual(grad, residual, out):
    """``out = grad + residual`` (what a compressor with error feedback encodes)."""
    for i in range(grad.shape[0]):
        out[i] = grad[i] + residual[i]
