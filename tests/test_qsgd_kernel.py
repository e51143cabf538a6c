"""qsgd's kernels against a plain numpy restatement of the layout and its py_func, and its
random source: the rounding of neighbouring elements, encodings and workers is independent."""
import numpy as np
import pytest

from psgd.compress import make
from psgd.kernels import compress as K

CASES = [(0, 64), (1, 64), (9, 3), (63, 64), (64, 64), (200, 64), (1000, 63), (1030, 512),
         (4099, 512)]


def np_uniforms(state):
    """The next CHUNK uniforms of the LANES streams (advanced in place), as the kernel draws."""
    for shift, left in ((13, True), (7, False), (17, True)):
        state ^= (state << np.uint64(shift)) if left else (state >> np.uint64(shift))
    low = ((state >> np.uint64(9)) & np.uint64(0x7FFFFF)).astype(np.uint32)
    high = (state >> np.uint64(41)).astype(np.uint32)
    return (np.concatenate([low, high]) | np.uint32(0x3F800000)).view(np.float32) - 1


def np_norm(x):
    """The kernel's order: element i into partial sum i % 64, then the 64 added pairwise."""
    acc = np.zeros(64, np.float32)
    sq = x * x
    for lo in range(0, x.shape[0], 64):
        acc[:sq[lo:lo + 64].shape[0]] += sq[lo:lo + 64]
    w = 64
    while w > 1:
        w //= 2
        acc[:w] += acc[w:2 * w]
    return np.sqrt(acc[0])


def np_encode(g, bits, bucket, state, maxnorm=False):
    """qsgd's frame body for ``g`` (float32 (n,)) in numpy: norms (``maxnorm``: the largest
    magnitudes), then the codes bit-packed (bits = 1: code 1, +norm, where
    g / norm / 2 + u >= 1 / 2)."""
    s = 2 ** (bits - 1) - 1
    norms, codes = [], []
    for lo in range(0, g.shape[0], bucket):
        x = g[lo:lo + bucket]
        norm = np.abs(x).max() if maxnorm else np_norm(x)
        u = np.concatenate([np_uniforms(state) for _ in range(0, x.shape[0], K.CHUNK)])
        norms.append(norm)
        if bits == 1:
            half_scale = np.float32(0.5) / norm if norm > 0 else np.float32(0)
            codes.append((x * half_scale + u[:x.shape[0]] >= np.float32(0.5)).astype(np.uint8))
            continue
        scale = np.float32(s) / norm if norm > 0 else np.float32(0)
        level = np.minimum(np.float32(s), np.floor(np.abs(x) * scale + u[:x.shape[0]]))
        codes.append(np.where(x >= 0, s + level, s - level).astype(np.uint8))
    codes = np.concatenate(codes) if codes else np.zeros(0, np.uint8)
    low_bits = np.unpackbits(codes[:, None], axis=1, bitorder="little")[:, :bits]
    packed = np.packbits(low_bits.ravel(), bitorder="little")
    return np.concatenate([np.array(norms, np.float32).view(np.uint8), packed])


def np_decode_add(body, bits, bucket, dst):
    n, s = dst.shape[0], 2 ** (bits - 1) - 1
    nb = -(-n // bucket)
    norms = body[:4 * nb].view(np.float32)
    bits_ = np.unpackbits(body[4 * nb:], bitorder="little")[:n * bits].reshape(n, bits)
    codes = np.packbits(bits_, axis=1, bitorder="little")[:, 0].astype(np.float32)
    if bits == 1:
        norm = np.repeat(norms, bucket)[:n]
        dst += np.where(codes == 1, norm, -norm)
        return
    step = np.repeat(norms / np.float32(s), bucket)[:n]
    dst += (codes - np.float32(s)) * step


def test_a_buckets_largest_magnitude_is_nan_where_the_bucket_holds_one():
    """As the L2 norm is: the bucket then decodes to NaN, which the servers' check sees."""
    acc = np.zeros(64, np.float32)
    for where in (0, 5, 64, 129):
        x = np.random.default_rng(where).standard_normal(130).astype(np.float32)
        assert K._bucket_reduce(x, acc, K.MAX_ABS) == np.abs(x).max()
        x[where] = np.nan
        assert np.isnan(K._bucket_reduce(x, acc, K.MAX_ABS))


def streams(seed=7):
    return make("qsgd:4", 64, seed=seed).state.copy()


@pytest.mark.parametrize("n, bucket", CASES)
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("maxnorm", [False, True])
def test_qsgd_encode_is_numpys_encoding_bit_for_bit(n, bucket, bits, maxnorm):
    """Norms (L2 or largest magnitude), uniforms, levels and packing (the two-codes-a-byte and
    byte-a-code paths, and the general one) as numpy computes them, and the streams left
    where numpy leaves them."""
    g = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    g[::7] = 0.0
    want_state, state = streams(), streams()
    want = np_encode(g, bits, bucket, want_state, maxnorm)
    out = np.zeros(want.shape[0] + 16, np.uint8)
    assert K.qsgd_encode(g, bits, bucket, out, state, maxnorm) == want.shape[0]
    np.testing.assert_array_equal(out[:want.shape[0]], want)
    np.testing.assert_array_equal(state, want_state)


@pytest.mark.parametrize("n, bucket", CASES)
@pytest.mark.parametrize("bits", [1, 3, 4, 8])
def test_qsgd_decode_add_is_numpys_decoding_bit_for_bit(n, bucket, bits):
    rng = np.random.default_rng(n)
    g = rng.standard_normal(n).astype(np.float32)
    body = np_encode(g, bits, bucket, streams())
    dst = rng.standard_normal(n).astype(np.float32)
    want = dst.copy()
    np_decode_add(body, bits, bucket, want)
    K.qsgd_decode_add(body, bits, bucket, dst)
    np.testing.assert_array_equal(dst, want)


@pytest.mark.parametrize("bits", [1, 4, 5, 8])
def test_qsgd_kernels_compute_what_their_python_computes(bits):
    """The compiled kernels against their own Python (``py_func``), helpers included."""
    g = np.random.default_rng(bits).standard_normal(700).astype(np.float32)
    acc, py_acc = np.zeros(64, np.float32), np.zeros(64, np.float32)
    for op in (K.SUM_ABS, K.SUM_SQUARES, K.MAX_ABS):
        assert K._bucket_reduce(g[:130], acc, op) == K._bucket_reduce.py_func(g[:130], py_acc, op)
    s = 2 ** (bits - 1) - 1
    state, py_state = streams(), streams()
    code, py_code = np.zeros(130, np.uint8), np.zeros(130, np.uint8)
    K._codes(g[:130], np.float32(0.37), s, state, np.zeros(K.CHUNK, np.uint32), code)
    K._codes.py_func(g[:130], np.float32(0.37), s, py_state, np.zeros(K.CHUNK, np.uint32),
                     py_code)
    np.testing.assert_array_equal(code, py_code)
    np.testing.assert_array_equal(state, py_state)
    K._binary_flags(g[:130], np.float32(0.37), state, np.zeros(K.CHUNK, np.uint32), code)
    K._binary_flags.py_func(g[:130], np.float32(0.37), py_state, np.zeros(K.CHUNK, np.uint32),
                            py_code)
    np.testing.assert_array_equal(code, py_code)
    packed, py_packed = np.zeros(20, np.uint8), np.zeros(20, np.uint8)
    K._pack_flags(code, 5, packed)
    K._pack_flags.py_func(code, 5, py_packed)
    np.testing.assert_array_equal(packed, py_packed)
    out, py_out = np.zeros(1000, np.uint8), np.zeros(1000, np.uint8)
    length = K.qsgd_encode(g, bits, 96, out, state)
    assert length == K.qsgd_encode.py_func(g, bits, 96, py_out, py_state)
    np.testing.assert_array_equal(out, py_out)
    np.testing.assert_array_equal(state, py_state)
    assert length == K.qsgd_encode(g, bits, 96, out, state, True)
    assert length == K.qsgd_encode.py_func(g, bits, 96, py_out, py_state, True)
    np.testing.assert_array_equal(out, py_out)
    dst, py_dst = np.ones(700, np.float32), np.ones(700, np.float32)
    K.qsgd_decode_add(out[:length], bits, 96, dst)
    K.qsgd_decode_add.py_func(out[:length], bits, 96, py_dst)
    np.testing.assert_array_equal(dst, py_dst)


def rounded_up(g, bucket, seed, draws):
    """For ``draws`` encodings with qsgd:8 (one code a byte): whether each element rounded up
    (int8 (draws, n)), and the probability it should have (float64 (n,))."""
    comp = make("qsgd:8", bucket, seed=seed)
    n, nb = g.shape[0], -(-g.shape[0] // bucket)
    frame = np.zeros(comp.max_bytes(n), np.uint8)
    ups = np.empty((draws, n), np.int8)
    for d in range(draws):
        body = frame[8:comp.encode(g, frame)]
        scale = np.repeat(np.float32(127) / body[:4 * nb].view(np.float32), bucket)[:n]
        low = np.floor(np.abs(g) * scale)
        ups[d] = np.abs(body[4 * nb:].astype(np.int16) - 127) - low
    return ups, (np.abs(g) * scale).astype(np.float64) % 1


def test_qsgd_rounds_neighbours_encodings_and_workers_independently():
    """Standardized round-ups z = (up - p) / sqrt(p (1 - p)) have mean 0 and are uncorrelated
    between neighbours, the two halves of one draw (LANES apart), one stream's successive
    draws (CHUNK apart), successive encodings and two workers' streams: 5 sigma each."""
    g = np.random.default_rng(11).standard_normal(4096).astype(np.float32)
    ups, p = rounded_up(g, 512, seed=1, draws=100)
    other, _ = rounded_up(g, 512, seed=2, draws=100)
    keep = p * (1 - p) > 0.01
    sd = np.sqrt(p * (1 - p))
    z = np.where(keep, (ups - p) / np.where(keep, sd, 1), 0)
    z_other = np.where(keep, (other - p) / np.where(keep, sd, 1), 0)
    count = keep.sum() * ups.shape[0]
    assert abs(z.sum()) / np.sqrt(count) < 5
    assert abs((z * z).sum() / count - 1) < 0.05
    pairs = {"neighbours": (z[:, :-1], z[:, 1:]), "draw halves": (z[:, :-K.LANES], z[:, K.LANES:]),
             "one stream": (z[:, :-K.CHUNK], z[:, K.CHUNK:]), "encodings": (z[:-1], z[1:]),
             "workers": (z, z_other)}
    for name, (a, b) in pairs.items():
        both = (a != 0) & (b != 0)
        corr = (a * b).sum() / both.sum()
        assert abs(corr) < 5 / np.sqrt(both.sum()), (name, corr)
