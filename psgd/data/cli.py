"""`python -m psgd data {convert,synth,info}`: make, convert and inspect HDF5 datasets."""
from __future__ import annotations

import argparse
import time

DESCRIPTION = """\
make, convert and inspect psgd HDF5 datasets (/train/x, /train/y, /test/x, /test/y)

  psgd data synth -o synth.h5                       deterministic synthetic 10-class 1x28x28
  psgd data convert --idx-train-images F --idx-train-labels F \\
                    --idx-test-images F --idx-test-labels F -o mnist.h5
  psgd data convert --npz data.npz -o data.h5       keys x_train, y_train, x_test, y_test
  psgd data info FILE
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``convert``, ``synth`` and ``info`` sub-commands to the ``data`` parser."""
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True,
                                parser_class=type(parser))

    p = sub.add_parser("convert", help="convert MNIST-style IDX files or an .npz into the HDF5 layout",
                       description="Convert four IDX files (gzip or raw) or one .npz into a psgd "
                                   "HDF5 dataset. uint8 stays uint8 with scale 1/255; floats become "
                                   "float32 with scale 1.")
    p.add_argument("--idx-train-images", metavar="F", help="IDX images file (idx3), train split")
    p.add_argument("--idx-train-labels", metavar="F", help="IDX labels file (idx1), train split")
    p.add_argument("--idx-test-images", metavar="F", help="IDX images file (idx3), test split")
    p.add_argument("--idx-test-labels", metavar="F", help="IDX labels file (idx1), test split")
    p.add_argument("--npz", metavar="F", help=".npz with x_train, y_train, x_test, y_test")
    p.add_argument("--nhwc", action="store_true",
                   help="4-d npz arrays are channels-last (N, H, W, C); store as NCHW")
    p.add_argument("--classes", type=int, metavar="N", help="number of classes (default: max label + 1)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.h5", help="output HDF5 file")

    p = sub.add_parser("synth", help="write the deterministic synthetic 10-class 1x28x28 dataset",
                       description="Write the synthetic dataset: each class is a few smooth strokes "
                                   "with random shifts, amplitudes, distractors and noise. The same "
                                   "seed gives an identical file.")
    p.add_argument("-o", "--output", required=True, metavar="OUT.h5", help="output HDF5 file")
    p.add_argument("--train", type=int, default=12000, metavar="N", help="training samples (default 12000)")
    p.add_argument("--test", type=int, default=2000, metavar="N", help="test samples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")

    p = sub.add_parser("info", help="print shapes, dtypes, class balance, scaling and storage of a dataset")
    p.add_argument("file", metavar="FILE", help="a psgd HDF5 dataset")


def run(args: argparse.Namespace) -> None:
    """Run the chosen ``data`` action."""
    {"convert": _convert, "synth": _synth, "info": _info}[args.data_command](args)


def _convert(args: argparse.Namespace) -> None:
    from psgd.data import idx, npz
    idx_files = [args.idx_train_images, args.idx_train_labels, args.idx_test_images, args.idx_test_labels]
    t0 = time.perf_counter()
    if args.npz and any(idx_files):
        raise ValueError("convert: give either --npz or the four --idx-* files, not both")
    if args.npz:
        out = npz.convert_npz(args.npz, args.output, args.classes, nhwc=args.nhwc)
    elif all(idx_files):
        out = idx.convert_idx(*idx_files, args.output, args.classes)
    elif any(idx_files):
        names = ["--idx-train-images", "--idx-train-labels", "--idx-test-images", "--idx-test-labels"]
        missing = [n for n, f in zip(names, idx_files) if not f]
        raise ValueError(f"convert: IDX input also needs {', '.join(missing)}")
    else:
        raise ValueError("convert: give --npz F or the four --idx-* files")
    print(f"wrote {out} in {time.perf_counter() - t0:.1f}s")
    _print_info(out)


def _synth(args: argparse.Namespace) -> None:
    from psgd.data import synth
    t0 = time.perf_counter()
    out = synth.write_synthetic(args.output, args.train, args.test, args.seed)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f}s")
    _print_info(out)


def _info(args: argparse.Namespace) -> None:
    _print_info(args.file)


def _print_info(path) -> None:
    from psgd.data.reader import dataset_info
    info = dataset_info(path)
    print(f"{info['path']}: format_version {info['format_version']}, source {info['source'] or '-'}")
    print(f"  input shape {info['input_shape']}, {info['n_classes']} classes, "
          f"x_float = x * {info['scale']:.6g} + {info['offset']:.6g}")
    for split in ("train", "test"):
        s = info[split]
        comp = f"{s['compression']}" + (f" {s['compression_opts']}" if s["compression_opts"] is not None else "")
        print(f"  {split}: x {s['x_shape']} {s['x_dtype']}, y {s['y_dtype']}, "
              f"chunks {s['chunks']}, compression {comp if s['compression'] else 'none'}")
        counts = s["class_counts"]
        n = max(1, s["n"])
        balance = "  ".join(f"{c}:{k}" for c, k in enumerate(counts))
        print(f"    classes {balance}  (min {min(counts) / n:.1%}, max {max(counts) / n:.1%})")
