"""Push compressors: round trips against plain numpy, qsgd's unbiasedness and variance bound,
error feedback's invariant, compressed bsp and all-reduce, and the flags' errors."""
import json

import numpy as np
import pytest

from psgd.compress import make
from psgd.compress.feedback import PushEncoder
from psgd.compress.base import HEADER_BYTES
from psgd.errors import PsgdError
from psgd.mpi.shardmap import ShardMap

LENGTHS = [0, 1, 7, 8, 9, 511, 512, 513, 1000, 4099]
BUCKET = 64


def round_trip(spec, g, bucket=BUCKET, comp=None):
    comp = comp or make(spec, bucket)
    frame = np.zeros(comp.max_bytes(g.shape[0]), np.uint8)
    length = comp.encode(g, frame)
    assert HEADER_BYTES <= length <= frame.shape[0]
    out = np.zeros_like(g)
    comp.decode_add(frame[:length], out)
    return out, length


def grads(n, k=0):
    return np.random.default_rng(n + 1000 * k).standard_normal(n).astype(np.float32)


def bucket_scale(part, scale):
    """qsgd's scale of a bucket, in float64: its largest magnitude or its L2 norm."""
    part = part.astype(np.float64)
    return np.abs(part).max() if scale == "max" else np.linalg.norm(part)


@pytest.mark.parametrize("n", LENGTHS)
def test_fp16_round_trips_as_numpy_rounds(n):
    g = grads(n) * 100
    out, length = round_trip("fp16", g)
    np.testing.assert_array_equal(out, g.astype(np.float16).astype(np.float32))
    assert length == HEADER_BYTES + 2 * n


def test_fp16_rounds_every_kind_of_float_as_numpy_does():
    """Subnormals, ties to even, overflow to infinity, signed zeros: the same half bits as
    numpy's astype(float16); a NaN stays a NaN."""
    rng = np.random.default_rng(0)
    g = np.concatenate([
        rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65520, 65519.99, 6e-8, 3e-8,
                    2.98e-8, -1e-7, 1 + 2**-11, 1 + 3 * 2**-11, 2**-24, 2**-25, 1.5 * 2**-25])])
    comp = make("fp16")
    frame = np.zeros(comp.max_bytes(g.shape[0]), np.uint8)
    half = frame[HEADER_BYTES:comp.encode(g, frame)].view(np.float16)
    with np.errstate(over="ignore"):
        want = g.astype(np.float16)
    nan = np.isnan(g)
    np.testing.assert_array_equal(half.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    assert np.isnan(half[nan]).all()


def test_fp16_encode_computes_what_its_python_computes():
    """On every kind of float (its integer arithmetic wraps mod 2**32 in both)."""
    from psgd.kernels.compress import fp16_encode
    g = np.concatenate([grads(3000).view(np.uint32) * np.uint32(2654435761),
                        np.float32([0.0, -0.0, np.inf, np.nan, 65520, 6e-8, 2**-25]).view(
                            np.uint32)]).view(np.float32)
    out, py_out = np.zeros(2 * g.size, np.uint8), np.zeros(2 * g.size, np.uint8)
    fp16_encode(g, out)
    with np.errstate(all="ignore"):
        fp16_encode.py_func(g, py_out)
    np.testing.assert_array_equal(out, py_out)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("bucket", [BUCKET, 7])
def test_sign_sends_signs_and_each_buckets_mean_magnitude(n, bucket):
    """Buckets of 7 start mid-byte (off the decode's byte-spreading path)."""
    g = grads(n)
    g[::5] = 0.0
    out, length = round_trip("sign", g, bucket)
    scale = np.zeros(n, np.float32)
    for lo in range(0, n, bucket):
        scale[lo:lo + bucket] = np.abs(g[lo:lo + bucket]).mean(dtype=np.float64)
    np.testing.assert_allclose(out, np.where(g >= 0, scale, -scale), rtol=1e-6)
    assert length == HEADER_BYTES + 4 * -(-n // bucket) + -(-n // 8)


@pytest.mark.parametrize("bucket", [BUCKET, 7])
def test_sign_kernels_compute_what_their_python_computes(bucket):
    from psgd.kernels.compress import sign_decode_add, sign_encode
    g = grads(1001)
    out, py_out = np.zeros(1200, np.uint8), np.zeros(1200, np.uint8)
    length = sign_encode(g, bucket, out)
    assert length == sign_encode.py_func(g, bucket, py_out)
    np.testing.assert_array_equal(out, py_out)
    dst, py_dst = grads(1001, k=1), grads(1001, k=1)
    sign_decode_add(out[:length], bucket, dst)
    sign_decode_add.py_func(out[:length], bucket, py_dst)
    np.testing.assert_array_equal(dst, py_dst)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("fraction", [0.01, 0.3, 1.0])
def test_topk_keeps_exactly_the_largest_magnitudes(n, fraction):
    g = grads(n)
    g[3::7] = g[0] if n else 0.0      # ties
    out, length = round_trip(f"topk:{fraction}", g)
    k = min(n, max(1, int(np.ceil(fraction * n)))) if n else 0
    order = np.argsort(-np.abs(g), kind="stable")[:k]   # ties: the lowest indices first
    want = np.zeros_like(g)
    want[order] = g[order]
    np.testing.assert_array_equal(out, want)
    assert length == HEADER_BYTES + 4 + 8 * k


@pytest.mark.parametrize("n, bucket", [(n, BUCKET) for n in LENGTHS] + [(1000, 63), (9, 3)])
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("scale", ["l2", "max"])
def test_qsgd_decodes_to_a_neighbouring_level_of_every_element(n, bucket, bits, scale):
    """Odd buckets start mid-byte (4 bits: off the two-codes-a-byte path)."""
    g = grads(n)
    spec = f"qsgd:{bits}:{scale}"
    out, length = round_trip(spec, g, comp=make(spec, bucket, seed=n))
    s = 2 ** (bits - 1) - 1
    for lo in range(0, n, bucket):
        part, got = g[lo:lo + bucket], out[lo:lo + bucket]
        norm = bucket_scale(part, scale)
        levels = got / norm * s
        np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
        np.testing.assert_array_less(np.abs(levels - part / norm * s), 1 + 1e-3)
        assert np.all((np.sign(got) == np.sign(part)) | (got == 0))
    assert length == HEADER_BYTES + 4 * -(-n // bucket) + -(-n * bits // 8)


@pytest.mark.parametrize("n, bucket", [(n, BUCKET) for n in LENGTHS] + [(1000, 63), (9, 3),
                                                                        (100, 7)])
@pytest.mark.parametrize("scale", ["l2", "max"])
def test_qsgd1_decodes_every_element_to_plus_or_minus_its_buckets_norm(n, bucket, scale):
    """One bit per element (buckets of 63, 7 and 3 start mid-byte); both signs occur."""
    g = grads(n)
    spec = f"qsgd:1:{scale}"
    out, length = round_trip(spec, g, comp=make(spec, bucket, seed=n))
    for lo in range(0, n, bucket):
        norm = np.float32(bucket_scale(g[lo:lo + bucket], scale))
        got = out[lo:lo + bucket]
        np.testing.assert_allclose(np.abs(got), norm, rtol=1e-6)
    if n >= 100:
        assert (out > 0).any() and (out < 0).any()
    assert length == HEADER_BYTES + 4 * -(-n // bucket) + -(-n // 8)


@pytest.mark.parametrize("scale", ["l2", "max"])
def test_qsgd1_is_unbiased_and_its_variance_is_the_sum_of_norm2_minus_g2(scale):
    """+norm with probability (1 + g / norm) / 2: the mean of many encodings converges to g
    (each element within 5 sigma, sigma = sqrt(norm^2 - g^2 / draws)), and E||Q(g) - g||^2
    = sum(norm^2 - g_i^2) (with the L2 norm (n - 1) ||g||^2 per bucket of n), within 5
    standard errors."""
    g = np.concatenate([grads(BUCKET, k=1), grads(BUCKET // 2, k=2) * 3])
    comp = make(f"qsgd:1:{scale}", BUCKET, seed=3)
    draws = np.array([round_trip("", g, comp=comp)[0] for _ in range(4000)], np.float64)
    norm = np.repeat([bucket_scale(g[lo:lo + BUCKET], scale)
                      for lo in range(0, g.size, BUCKET)], BUCKET)[:g.size]
    g64 = g.astype(np.float64)
    sigma = np.sqrt((norm ** 2 - g64 ** 2) / len(draws))
    assert np.all(np.abs(draws.mean(axis=0) - g) <= 5 * sigma + 1e-6)
    sq = ((draws - g) ** 2).sum(axis=1)
    expected = float((norm ** 2 - g64 ** 2).sum())
    if scale == "l2":
        assert expected == pytest.approx(sum((min(BUCKET, g.size - lo) - 1) * g64[lo:lo + BUCKET]
                                             @ g64[lo:lo + BUCKET]
                                             for lo in range(0, g.size, BUCKET)))
    assert abs(sq.mean() - expected) <= 5 * sq.std() / np.sqrt(len(draws))


@pytest.mark.parametrize("n, bucket", [(1000, BUCKET), (1000, 63), (9, 3)])
def test_qsgd_max_decodes_to_a_level_of_the_buckets_largest_magnitude(n, bucket):
    """qsgd:4 (max): levels of max|bucket| / s; the largest element is sent exactly."""
    g = grads(n)
    out, length = round_trip("", g, comp=make("qsgd:4:max", bucket, seed=n))
    for lo in range(0, n, bucket):
        part, got = g[lo:lo + bucket], out[lo:lo + bucket]
        top = np.abs(part).max()
        levels = got / top * 7
        np.testing.assert_allclose(levels, np.round(levels), atol=1e-3)
        np.testing.assert_array_less(np.abs(levels - part / top * 7), 1 + 1e-3)
        k = np.argmax(np.abs(part))
        np.testing.assert_allclose(got[k], part[k], rtol=1e-6)
    assert length == HEADER_BYTES + 4 * -(-n // bucket) + -(-n * 4 // 8)
    assert make("qsgd:4:max", bucket).name == make("qsgd:4", bucket).name == "qsgd:4"
    assert make("qsgd:4:l2", bucket).name == "qsgd:4:l2"


def test_qsgd_max_is_unbiased_with_a_fraction_of_l2s_variance():
    """Scaled by the largest magnitude each level is at most max / s wide, so
    E||Q(g) - g||^2 <= n max^2 / (4 s^2); on Gaussian buckets of 512 that is under a tenth
    of what the L2 norm's levels give."""
    g = grads(512, k=9)
    draws = {scale: np.array([round_trip("", g, comp=comp)[0] for _ in range(2000)],
                             np.float64)
             for scale, comp in (("max", make("qsgd:4", 512, seed=3)),
                                 ("l2", make("qsgd:4:l2", 512, seed=3)))}
    top = float(np.abs(g).max())
    frac = np.abs(g) / top * 7 % 1
    sigma = top / 7 * np.sqrt(frac * (1 - frac) / 2000)
    assert np.all(np.abs(draws["max"].mean(axis=0) - g) <= 5 * sigma + 1e-6)
    variance = {k: ((d - g) ** 2).sum(axis=1).mean() for k, d in draws.items()}
    assert variance["max"] <= 512 * top ** 2 / (4 * 49)
    assert variance["max"] < 0.1 * variance["l2"]


@pytest.mark.parametrize("bits", [2, 4])
def test_qsgd_is_unbiased_within_its_variance_bound(bits):
    """Scaled by the L2 norm, the mean of many encodings converges to the vector and
    E||Q(g) - g||^2 obeys QSGD's Lemma 3.1: at most min(n / s^2, sqrt(n) / s) ||g||^2 per
    bucket of n elements (the largest magnitude's bound: the test above)."""
    g = grads(BUCKET, k=bits)
    s = 2 ** (bits - 1) - 1
    comp = make(f"qsgd:{bits}:l2", BUCKET, seed=3)
    draws = np.array([round_trip("", g, comp=comp)[0] for _ in range(4000)], np.float64)
    err = draws.mean(axis=0) - g
    # each element rounds up with p = the fraction of |g| / norm * s: its mean's sigma
    norm = np.linalg.norm(g.astype(np.float64))
    frac = np.abs(g) / norm * s % 1
    sigma = norm / s * np.sqrt(frac * (1 - frac) / len(draws))
    assert np.all(np.abs(err) <= 5 * sigma + 1e-6)
    variance = ((draws - g) ** 2).sum(axis=1).mean()
    bound = min(BUCKET / s ** 2, np.sqrt(BUCKET) / s) * float(g.astype(np.float64) @ g)
    assert variance <= bound
    assert variance > 0.01 * bound          # it is a random rounding, not a deterministic one


@pytest.mark.parametrize("spec", ["topk:0.05", "sign", "qsgd:3"])
def test_error_feedback_sends_every_part_of_every_gradient_eventually(spec):
    """sum of what was sent + the residual = the sum of the gradients: exact where the values
    are dyadic (topk moves values unchanged), to float32 rounding otherwise."""
    smap = ShardMap(300, 2)
    comp = make(spec, 32)
    enc = PushEncoder(comp, smap, feedback=True)
    rng = np.random.default_rng(5)
    sent, total = np.zeros(300, np.float64), np.zeros(300, np.float64)
    for _ in range(40):
        g = (rng.integers(-64, 65, 300) / 64).astype(np.float32)
        total += g
        sent += decoded(comp, smap, enc.encode(g))
    if spec.startswith("topk"):
        np.testing.assert_array_equal(sent + enc.residual, total)
    else:
        np.testing.assert_allclose(sent + enc.residual, total, atol=1e-4)
    assert np.abs(enc.residual).max() > 0


def decoded(comp, smap, frames):
    """The full vector the servers decode from one push's per-shard ``frames``."""
    out = np.zeros(smap.n, np.float32)
    for s, frame in enumerate(frames):
        lo, hi = smap.range(s)
        comp.decode_add(frame, out[lo:hi])
    return out


def dyadic_pushes(n, bucket, rng):
    """What a worker encodes, p: in every bucket of 4 a random signed permutation of
    (1, 2, 2, 0) / 8, so that a bucket's L2 norm (3/8), its largest and mean magnitudes (1/4,
    5/32) and qsgd's steps norm / s for s = 1 are exact, and so is every sum and difference
    below."""
    pattern = np.array([1, 2, 2, 0], np.float64) / 8
    p = np.concatenate([rng.permutation(pattern) for _ in range(n // bucket)])
    return p * rng.choice([-1, 1], n)


@pytest.mark.parametrize("spec", ["topk:0.05", "sign", "qsgd:1", "qsgd:2", "qsgd:1:l2",
                                  "qsgd:2:l2"])
def test_error_feedback_invariant_holds_exactly_on_exactly_representable_pushes(spec):
    """sum of what was sent + the residual == the sum of the gradients, bit for bit, for every
    compressor with error feedback, over 60 pushes: each gradient g = p - r is chosen so that
    the worker encodes p = g + r from :func:`dyadic_pushes` (every float32 operation of the
    encoder, the decoder and the residual r = p - decode(p) then exact; power-of-two length,
    shards and bucket). In general sign's and qsgd's are not exact (see the test above)."""
    n, bucket = 256, 4
    smap = ShardMap(n, 2)
    comp = make(spec, bucket, seed=9)
    enc = PushEncoder(comp, smap, feedback=True)
    rng = np.random.default_rng(7)
    sent, total = np.zeros(n, np.float64), np.zeros(n, np.float64)
    for _ in range(60):
        g = (dyadic_pushes(n, bucket, rng) - enc.residual).astype(np.float32)
        assert np.array_equal(g + enc.residual.astype(np.float64),
                              g + enc.residual)          # g + r is exact in float32
        total += g
        sent += decoded(comp, smap, enc.encode(g))
    np.testing.assert_array_equal(sent + enc.residual, total)
    assert np.abs(enc.residual).max() > 0 and np.abs(sent).max() > 0


def test_without_feedback_topk_drops_what_it_does_not_send():
    smap = ShardMap(300, 1)
    enc = PushEncoder(make("topk:0.05"), smap, feedback=False)
    g = grads(300)
    (frame,) = enc.encode(g)
    out = np.zeros(300, np.float32)
    make("topk:0.05").decode_add(frame, out)
    assert enc.residual is None and np.count_nonzero(out) == 15


@pytest.mark.parametrize("spec", ["sign", "qsgd:4", "qsgd:1", "qsgd:8:l2", "topk:0.01",
                                  "topk:1.0", "fp16"])
@pytest.mark.parametrize("bucket", [1, 3, 512])
def test_a_fixed_length_codec_writes_every_frame_at_its_max_bytes(spec, bucket):
    # the all-gather posts receives of max_bytes(n) before any frame exists
    comp = make(spec, bucket, seed=1)
    assert comp.fixed_length
    rng = np.random.default_rng(5)
    for n in LENGTHS[1:]:
        for g in (rng.standard_normal(n).astype(np.float32), np.zeros(n, np.float32),
                  np.where(rng.random(n) < 0.9, 0.0, 1.0).astype(np.float32)):
            frame = np.zeros(comp.max_bytes(n), np.uint8)
            assert comp.encode(g, frame) == comp.max_bytes(n)


def test_sparse_frames_vary_in_length_and_say_so():
    comp = make("sparse")
    frame = np.zeros(comp.max_bytes(100), np.uint8)
    assert not comp.fixed_length
    assert comp.encode(np.zeros(100, np.float32), frame) < comp.max_bytes(100)


def test_a_frame_for_another_length_or_compressor_is_refused():
    frame = np.zeros(200, np.uint8)
    n = make("sign").encode(grads(100), frame)
    with pytest.raises(PsgdError, match=r"the frame holds 100 elements coded 3, expected 99"):
        make("sign").decode_add(frame[:n], np.zeros(99, np.float32))
    with pytest.raises(PsgdError, match=r"coded 3, expected 100 coded 1 \(fp16\)"):
        make("fp16").decode_add(frame[:n], np.zeros(100, np.float32))


@pytest.mark.parametrize("flags, message", [
    (["--compress", "zip"], "--compress 'zip' is not one of none, fp16"),
    (["--compress", "qsgd:9"], r"--compress qsgd:9: bits must be in 1\.\.8$"),
    (["--compress", "qsgd:0"], r"--compress qsgd:0: bits must be in 1\.\.8$"),
    (["--compress", "qsgd:x"], "qsgd takes the bits per element"),
    (["--compress", "qsgd:4:linf"], "qsgd.s scale is max or l2"),
    (["--compress", "topk:0"], r"the fraction must be in \(0, 1\]"),
    (["--compress", "topk:1.5"], r"the fraction must be in \(0, 1\]"),
    (["--compress", "sign", "--compress-bucket", "0"], "--compress-bucket must be >= 1"),
    (["--compress", "sign", "--protocol", "hogwild"], "--compress sign applies to --protocol bsp"),
    (["--compress", "fp16", "--protocol", "gossip"], "not gossip"),
    (["--compress", "fp16", "--protocol", "allreduce", "--error-feedback", "on"],
     "--error-feedback on does not apply to --compress fp16 under --protocol allreduce"),
    (["--error-feedback", "on"], "--error-feedback on needs a --compress"),
    (["--compress", "sign", "--error-feedback", "yes"], "--error-feedback 'yes' is not auto"),
])
def test_bad_compression_flags_are_one_line(dataset, flags, message):
    import argparse

    from psgd.run import settings
    parser = argparse.ArgumentParser()
    settings.add_arguments(parser)
    with pytest.raises(ValueError, match=message):
        settings.resolve(parser.parse_args(["--data", dataset, *flags]), environ={})


def test_bsp_with_fp16_on_exactly_representable_gradients_equals_bsp(mpirun):
    runs = {}
    for compress in ("none", "fp16"):
        out = mpirun(4, ["compress_check.py", compress, "--servers", "2"]).stdout
        runs[compress] = json.loads(out.split("RESULT ", 1)[1])
    assert runs["fp16"]["params"] == runs["none"]["params"]
    assert runs["fp16"]["push_bytes"] < 0.6 * runs["none"]["push_bytes"]


@pytest.mark.parametrize("workers", [4, 3])
def test_compressed_allreduce_keeps_replicas_identical_and_fp16_exact_as_the_ring(mpirun,
                                                                                   workers):
    specs = ["none", "fp16", "topk:1.0", "qsgd:4", "topk:0.01", "sign", "sparse"]
    # pieces of 100 elements: the fp16 ring pipelines several per chunk
    out = mpirun(workers, ["compress_ring_check.py", *specs],
                 env={"PSGD_X_ALLREDUCE_SEGMENT_BYTES": "400"}).stdout
    runs = json.loads(out.split("RESULT ", 1)[1])
    assert all(runs[spec]["same"] for spec in specs)
    # every gathered sum is the rank-order sum of the workers' frames, replayed serially
    gathered = [spec for spec in specs if spec not in ("none", "fp16")]
    assert all(runs[spec]["params"] == runs[spec]["serial"] for spec in gathered)
    assert runs["sparse"]["params"] == runs["none"]["params"]      # lossless
    base = np.array(runs["none"]["params"])
    if workers == 4:     # every partial sum and the mean exact in half precision
        assert runs["fp16"]["params"] == runs["none"]["params"]
    else:                # the mean of 3 is not: fp16's rounding, and no more
        assert 0 < np.abs(np.array(runs["fp16"]["params"]) - base).max() < 0.05 * np.abs(base).max()
    # the all-gather of every element as index + value adds in rank order: the ring's sum
    assert runs["topk:1.0"]["params"] == runs["none"]["params"]
    for spec in ("qsgd:4", "topk:0.01", "sign"):
        assert runs[spec]["params"] != runs["none"]["params"]
        assert runs[spec]["push_bytes"] < runs["fp16"]["push_bytes"]


def test_compressed_training_measures_its_bytes_and_learns(mpirun, dataset, tmp_path):
    from psgd.run.metrics import read_log
    results = {}
    for spec in ("none", "qsgd:4", "topk:0.01", "sign"):
        log = tmp_path / f"{spec.replace(':', '')}.jsonl"
        mpirun(3, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--model",
                   "mlp:784-64-10", "--protocol", "ssp", "--steps", 60, "--batch-size", 32,
                   "--compress", spec, "--log", log, "--eval-every", 0])
        records = read_log(log)
        results[spec] = records[-1]
        steps = [r for r in records if r["kind"] == "step"]
        assert all(r["push_bytes_per_step"] > 0 for r in steps)
        n = records[0]["n_params"]      # each compressed step: float32's bytes / bytes sent
        assert all(r.get("compression_ratio") == (None if spec == "none" else pytest.approx(
            4 * n / r["push_bytes_per_step"])) for r in steps)
    import matplotlib.pyplot as plt

    from psgd.plot import draw
    fig = draw([str(tmp_path / "none.jsonl"), str(tmp_path / "qsgd4.jsonl")])
    ratio = [ax for ax in fig.axes if ax.get_ylabel() == "compression ratio (x)"]
    plt.close(fig)
    assert len(ratio) == 1 and min(ratio[0].get_lines()[0].get_ydata()) >= 7
    base = results["none"]["push_bytes"]
    assert results["none"]["compression_ratio"] == pytest.approx(1.0, rel=0.01)
    assert base / results["qsgd:4"]["push_bytes"] >= 7
    assert base / results["topk:0.01"]["push_bytes"] >= 25
    assert base / results["sign"]["push_bytes"] >= 25
    for spec, summary in results.items():
        assert summary["test_accuracy"] > 0.3, (spec, summary["test_accuracy"])


def test_compressed_allreduce_training_reports_its_bytes_per_step(mpirun, dataset, tmp_path):
    from psgd.run.metrics import read_log
    log = tmp_path / "sign.jsonl"
    mpirun(2, ["-m", "psgd", "train", "--data", dataset, "--quiet", "--model", "mlp:784-64-10",
               "--protocol", "allreduce", "--servers", 0, "--steps", 60, "--batch-size", 32,
               "--compress", "sign", "--log", log, "--eval-every", 0])
    summary = read_log(log)[-1]
    # against the float32 ring's 2(W-1)/W x 4 bytes per parameter
    assert summary["compression_ratio"] > 25 and summary["push_bytes"] > 0
    assert summary["test_accuracy"] > 0.3
