"""`make bench-compress`: encode + decode throughput of each push compressor on one core,
beside a plain numpy implementation of the same encoding, and the frame's size.

Prints a table and writes compress.{md,json} into runs/bench/compress-TIME/ (--publish:
bench/results/). Throughput is GB/s of float32
input for one encode and one decode-add of an n-element slice (best of --repeat).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

from psgd.compress import make  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

SPECS = ["fp16", "qsgd:1", "qsgd:4", "qsgd:4:l2", "qsgd:8", "topk:0.01", "sign"]


# ---------------------------------------------------------------- numpy peers


def np_fp16(g, bucket, rng):
    h = g.astype(np.float16)
    return h.nbytes, lambda dst: np.add(dst, h, out=dst, casting="unsafe")


def bucket_scales(b, l2):
    """Each bucket's (row's) qsgd scale: its L2 norm or its largest magnitude."""
    return (np.linalg.norm(b, axis=1) if l2 else np.abs(b).max(axis=1)).astype(np.float32)


def np_qsgd(bits, l2=False):
    def run(g, bucket, rng):
        s = 2 ** (bits - 1) - 1
        pad = (-g.size) % bucket
        b = np.concatenate([g, np.zeros(pad, np.float32)]).reshape(-1, bucket)
        norms = bucket_scales(b, l2)
        x = np.abs(b) / np.where(norms > 0, norms, 1)[:, None] * s
        level = np.minimum(np.floor(x + rng.random(x.shape, np.float32)), s).astype(np.int8)
        codes = (np.where(b >= 0, level, -level) + s).astype(np.uint8).ravel()[:g.size]
        packed = np.packbits(np.unpackbits(codes[:, None], axis=1, bitorder="little")[:, :bits],
                             bitorder="little")

        def decode(dst):
            bits_ = np.unpackbits(packed, bitorder="little")[:g.size * bits].reshape(-1, bits)
            c = np.packbits(bits_, axis=1, bitorder="little")[:, 0].astype(np.float32) - s
            c = np.concatenate([c, np.zeros(pad, np.float32)]).reshape(-1, bucket)
            dst += (c * (norms / s)[:, None]).ravel()[:g.size]
        return norms.nbytes + packed.nbytes, decode
    return run


def np_qsgd1(g, bucket, rng):
    pad = (-g.size) % bucket
    b = np.concatenate([g, np.zeros(pad, np.float32)]).reshape(-1, bucket)
    norms = bucket_scales(b, l2=False)
    half = np.float32(0.5) / np.where(norms > 0, norms, 1)[:, None]
    up = (b * half + rng.random(b.shape, np.float32) >= 0.5).ravel()[:g.size]
    packed = np.packbits(up, bitorder="little")

    def decode(dst):
        signs = np.unpackbits(packed, bitorder="little")[:g.size].astype(np.float32) * 2 - 1
        dst += signs * np.repeat(norms, bucket)[:g.size]
    return norms.nbytes + packed.nbytes, decode


def np_topk(fraction):
    def run(g, bucket, rng):
        k = max(1, int(np.ceil(fraction * g.size)))
        idx = np.argpartition(np.abs(g), g.size - k)[g.size - k:].astype(np.int32)
        vals = g[idx]
        return 4 + idx.nbytes + vals.nbytes, lambda dst: np.add.at(dst, idx, vals)
    return run


def np_sign(g, bucket, rng):
    pad = (-g.size) % bucket
    scales = np.abs(np.concatenate([g, np.zeros(pad, np.float32)])).reshape(-1, bucket).mean(1)
    bits = np.packbits(g >= 0, bitorder="little")

    def decode(dst):
        signs = np.unpackbits(bits, bitorder="little")[:g.size].astype(np.float32) * 2 - 1
        dst += signs * np.repeat(scales, bucket)[:g.size]
    return scales.nbytes + bits.nbytes, decode


PEERS = {"fp16": np_fp16, "qsgd:1": np_qsgd1, "qsgd:4": np_qsgd(4),
         "qsgd:4:l2": np_qsgd(4, l2=True), "qsgd:8": np_qsgd(8),
         "topk:0.01": np_topk(0.01), "sign": np_sign}


def best_of(repeat, fn):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(spec: str, n: int, bucket: int, repeat: int) -> dict:
    g = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    comp = make(spec, bucket, seed=1)
    frame = np.zeros(comp.max_bytes(n), np.uint8)
    dst = np.zeros(n, np.float32)

    def psgd_round():
        comp.decode_add(frame[:comp.encode(g, frame)], dst)

    psgd_round()   # compile
    rng = np.random.default_rng(1)

    def numpy_round():
        _, decode = PEERS[spec](g, bucket, rng)
        decode(dst)

    t_psgd, t_np = best_of(repeat, psgd_round), best_of(repeat, numpy_round)
    nbytes = comp.encode(g, frame)
    return {"compressor": spec, "n": n, "frame_bytes": nbytes, "ratio": 4 * n / nbytes,
            "numpy_bytes": PEERS[spec](g, bucket, rng)[0],
            "psgd_gb_s": 4 * n / t_psgd / 1e9, "numpy_gb_s": 4 * n / t_np / 1e9,
            "speedup": t_np / t_psgd}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=1 << 22, help="elements (default 4M floats)")
    parser.add_argument("--bucket", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="a smoke run (64K elements)")
    common.add_output_arguments(parser)
    args = parser.parse_args()
    out = common.out_dir(args, "compress")
    if args.quick:
        args.n, args.repeat = 1 << 16, 2
    rows = [measure(spec, args.n, args.bucket, args.repeat) for spec in SPECS]
    lines = [f"# Push compressors: encode + decode on one core ({args.n} float32, bucket "
             f"{args.bucket}, best of {args.repeat})", "",
             f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores. "
             "GB/s of float32 input for one encode and one decode-add.", "",
             "| compressor | frame bytes | ratio vs float32 | psgd GB/s | numpy GB/s | psgd / numpy |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['compressor']} | {r['frame_bytes']} | {r['ratio']:.1f}x | "
                     f"{r['psgd_gb_s']:.2f} | {r['numpy_gb_s']:.2f} | {r['speedup']:.1f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    name = "compress-quick" if args.quick else "compress"
    common.write_text(out / f"{name}.md", text, common.NO_DATA)
    common.write_json(out / f"{name}.json", {"rows": rows}, common.NO_DATA)


if __name__ == "__main__":
    main()
