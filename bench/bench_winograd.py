"""Per-layer forward and backward time of 3x3 and 5x5 convolutions by im2col and by Winograd F(2x2, 3x3)
or F(2x2, 5x5), one thread, at batch 64: the measurements behind Conv2D's choice
(psgd.nn.layers.WINOGRAD_MIN_CHANNELS, WINOGRAD5_MIN_CHANNELS).

``make bench-winograd``: the table into runs/bench/winograd-TIME/winograd.md (--publish:
bench/results/)."""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from psgd.nn.layers import Conv2D  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

# (H, W, C, F, k): cifar-cnn's 3x3 layers, resnet8's 16-channel one, C = 16 at 16x16 and 8x8;
# lenet's two 5x5 layers, and 5x5 ones with 8, 32 and 64 input channels
LAYERS = [(32, 32, 3, 32, 3), (32, 32, 32, 32, 3), (16, 16, 32, 64, 3), (16, 16, 64, 64, 3),
          (8, 8, 64, 128, 3), (32, 32, 16, 16, 3), (16, 16, 16, 32, 3), (8, 8, 16, 32, 3),
          (28, 28, 1, 16, 5), (14, 14, 16, 32, 5), (14, 14, 8, 16, 5), (14, 14, 32, 32, 5),
          (7, 7, 64, 64, 5)]


def best_ms(fn, repeats):
    """Least thread time of ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return 1e3 * min(times)


def layer_ms(shape, filters, k, batch, winograd, repeats):
    rng = np.random.default_rng(0)
    layer = Conv2D(shape, filters, k=k, pad=k // 2, winograd=winograd)
    pshape = layer.param_shapes()[0][1]
    layer.bind({"wb": np.empty(pshape, np.float32)}, {"wb": np.empty(pshape, np.float32)})
    layer.init_params(rng)
    x = rng.standard_normal((batch, *shape)).astype(np.float32)
    dy = rng.standard_normal((batch, *layer.out_shape)).astype(np.float32)
    fwd = best_ms(lambda: layer.forward(x), repeats)
    both = best_ms(lambda: (layer.forward(x), layer.backward(dy)), repeats)
    return fwd, both - fwd


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    common.add_output_arguments(ap)
    args = ap.parse_args(argv)
    out = common.out_dir(args, "winograd")
    lines = [f"k x k convolution, pad k // 2, batch {args.batch}, least thread time of "
             f"{args.repeats} (ms)", ""]
    lines.append(f"{'k: H x W x C -> F':<22}{'im2col fwd':>11}{'bwd':>7}{'winograd fwd':>14}{'bwd':>7}"
          f"{'wino/im2col':>13}{'chosen':>10}")
    print("\n".join(lines), flush=True)
    for h, w, c, f, k in LAYERS:
        fi, bi = layer_ms((h, w, c), f, k, args.batch, False, args.repeats)
        fw, bw = layer_ms((h, w, c), f, k, args.batch, True, args.repeats)
        chosen = "winograd" if Conv2D((h, w, c), f, k=k, pad=k // 2).winograd else "im2col"
        lines.append(f"{f'{k}: {h}x{w}x{c} -> {f}':<22}{fi:>11.1f}{bi:>7.1f}{fw:>14.1f}"
                     f"{bw:>7.1f}{(fw + bw) / (fi + bi):>13.2f}{chosen:>10}")
        print(lines[-1], flush=True)
    text = "\n".join(["```", *lines, "```"])
    print(f"wrote {common.write_text(out / 'winograd.md', text, common.NO_DATA)}")


if __name__ == "__main__":
    main()
