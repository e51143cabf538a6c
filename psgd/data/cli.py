"""`python -m psgd data {convert,synth,info}`: make, convert and inspect HDF5 datasets."""
from __future__ import annotations

import argparse
import re
import time

DESCRIPTION = """\
make, convert and inspect psgd HDF5 datasets (/train/x, /train/y, /test/x, /test/y)

  psgd data synth -o synth.h5                       deterministic synthetic 10-class 1x28x28
  psgd data synth --channels 3 -o colour.h5         the same strokes in colour, 3x32x32
  psgd data convert INPUT -o data.h5                INPUT: an .npz, a folder of IDX files,
                                                    a CIFAR-10 batch folder (python or binary),
                                                    or train/<class>/*.png and test/<class>/...
  psgd data convert --idx-train-images F --idx-train-labels F \\
                    --idx-test-images F --idx-test-labels F -o mnist.h5
  psgd data convert --npz data.npz -o data.h5       keys x_train, y_train, x_test, y_test
  psgd data convert --svmlight TRAIN TEST -o s.h5   svmlight/libsvm text into the sparse CSR layout
  psgd data synth --sparse -o sparse.h5             seeded sparse set, Zipf feature frequencies
  psgd data text FOLDER -o text.h5                  FOLDER/<class>/* text files (or FOLDER/train/<class>,
                                                    FOLDER/test/<class>) into L2-normalised TF-IDF
  psgd data info FILE
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``convert``, ``synth``, ``text`` and ``info`` sub-commands to the ``data`` parser."""
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True,
                                parser_class=type(parser))
    _add_convert(sub)
    _add_synth(sub)
    _add_text(sub)
    _add_info(sub)


def _add_convert(sub) -> None:
    p = sub.add_parser("convert", help="convert an .npz, IDX files, CIFAR-10 batches or image "
                                       "folders into the HDF5 layout",
                       description="Convert INPUT (its kind detected: an .npz; a folder of four IDX "
                                   "files, gzip or raw; a CIFAR-10 batch folder; an image tree "
                                   "train/<class>/*.png|jpg and test/<class>/..., which needs "
                                   "Pillow), or the files the flags name, into a psgd HDF5 dataset. "
                                   "uint8 stays uint8 with scale 1/255; floats become float32 with "
                                   "scale 1.")
    p.add_argument("input", nargs="?", metavar="INPUT",
                   help="an .npz file or a folder (IDX files, CIFAR-10 batches, or an image tree)")
    p.add_argument("--idx-train-images", metavar="F", help="IDX images file (idx3), train split")
    p.add_argument("--idx-train-labels", metavar="F", help="IDX labels file (idx1), train split")
    p.add_argument("--idx-test-images", metavar="F", help="IDX images file (idx3), test split")
    p.add_argument("--idx-test-labels", metavar="F", help="IDX labels file (idx1), test split")
    p.add_argument("--npz", metavar="F", help=".npz with x_train, y_train, x_test, y_test")
    p.add_argument("--nhwc", action="store_true",
                   help="4-d npz arrays are channels-last (N, H, W, C); store as NCHW")
    p.add_argument("--classes", type=int, metavar="N", help="number of classes (default: max label + 1)")
    p.add_argument("--size", type=_size, metavar="HxW",
                   help="resize every image of an image tree to H x W pixels (default: all must match)")
    p.add_argument("--svmlight", nargs=2, metavar=("TRAIN", "TEST"),
                   help="svmlight/libsvm text files, into the sparse CSR layout")
    p.add_argument("--features", type=int, metavar="D",
                   help="svmlight: declared number of features (default: largest index + 1)")
    p.add_argument("--index-base", choices=("auto", "0", "1"), default="auto",
                   help="svmlight: indices start at 0 or 1 (auto: 1 unless some index is 0)")
    p.add_argument("--keep-order", action="store_true",
                   help="store the rows in the source's order (default: a seeded shuffle of each split, "
                        "so a source sorted by class, as image folders are, is not split by class "
                        "between workers)")
    p.add_argument("--shuffle-seed", type=int, default=0, metavar="N",
                   help="seed of that shuffle (default 0; stored in the file's attributes)")
    p.add_argument("-o", "--output", required=True, metavar="OUT.h5", help="output HDF5 file")


def _add_synth(sub) -> None:
    p = sub.add_parser("synth", help="write the deterministic synthetic 10-class 1x28x28 dataset",
                       description="Write the synthetic dataset: each class is a few smooth strokes "
                                   "with random shifts, amplitudes, distractors and noise. The same "
                                   "seed gives an identical file.")
    p.add_argument("-o", "--output", required=True, metavar="OUT.h5", help="output HDF5 file")
    p.add_argument("--train", type=int, default=12000, metavar="N", help="training samples (default 12000)")
    p.add_argument("--test", type=int, default=2000, metavar="N", help="test samples (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--channels", type=int, choices=(1, 3), default=1,
                   help="1: greyscale 1x28x28 (default); 3: colour 3x32x32, each sample's strokes "
                        "and background in random colours and placed at a random offset")
    p.add_argument("--sparse", action="store_true",
                   help="a sparse CSR set with Zipf feature frequencies instead of images")
    p.add_argument("--features", type=int, default=20000, metavar="D", help="--sparse: features (default 20000)")
    p.add_argument("--nnz", type=int, default=40, metavar="K", help="--sparse: nonzeros per row (default 40)")
    p.add_argument("--classes", type=int, default=10, metavar="K", help="--sparse: classes (default 10)")


def _add_text(sub) -> None:
    p = sub.add_parser("text", help="vectorise a folder of class folders of text files into "
                                    "sparse TF-IDF rows",
                       description="Each file under FOLDER/<class>/ is a document of that class "
                                   "(FOLDER/train/<class>/ and FOLDER/test/<class>/ give the split; "
                                   "else a seeded rule makes it). Tokens: 2+ word characters, "
                                   "lower-cased; vocabulary and smooth idf ln((1+n)/(1+df))+1 from "
                                   "the training split; rows tf*idf scaled to unit L2 norm "
                                   "(scikit-learn's TfidfVectorizer defaults). The vocabulary, idf "
                                   "and classes are stored under /text.")
    p.add_argument("folder", metavar="FOLDER", help="a folder of class folders")
    p.add_argument("-o", "--output", required=True, metavar="OUT.h5", help="output HDF5 file")
    p.add_argument("--test-fraction", type=float, default=0.3, metavar="F",
                   help="without train/ and test/: the share of each class's files put in test, by "
                        "crc32 of 'seed:class/path' (default 0.3)")
    p.add_argument("--seed", type=int, default=0, help="seed of that split (default 0)")
    p.add_argument("--min-df", type=int, default=1, metavar="N",
                   help="keep tokens found in at least N training documents (default 1)")


def _add_info(sub) -> None:
    p = sub.add_parser("info", help="print shapes, dtypes, class balance, scaling and storage of a dataset")
    p.add_argument("file", metavar="FILE", help="a psgd HDF5 dataset")


def _size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)x(\d+)", text.strip().lower())
    if not m or min(int(m.group(1)), int(m.group(2))) < 1:
        raise argparse.ArgumentTypeError(f"expected HxW with positive sizes (e.g. 32x32), got {text!r}")
    return int(m.group(1)), int(m.group(2))


def run(args: argparse.Namespace) -> None:
    """Run the chosen ``data`` action."""
    {"convert": _convert, "synth": _synth, "text": _text, "info": _info}[args.data_command](args)


def _convert(args: argparse.Namespace) -> None:
    from psgd.data import detect, idx, npz
    idx_files = [args.idx_train_images, args.idx_train_labels, args.idx_test_images, args.idx_test_labels]
    order = {"keep_order": args.keep_order, "shuffle_seed": args.shuffle_seed}
    t0 = time.perf_counter()
    if args.svmlight:
        from psgd.data.svmlight import convert_svmlight
        out = convert_svmlight(*args.svmlight, args.output, args.features, args.index_base, **order)
        print(f"wrote {out} in {time.perf_counter() - t0:.1f}s")
        return _print_info(out)
    if args.input and (args.npz or any(idx_files)):
        raise ValueError(f"convert: give INPUT ({args.input}) or --npz / --idx-* files, not both")
    if args.npz and any(idx_files):
        raise ValueError("convert: give either --npz or the four --idx-* files, not both")
    if args.input:
        kind, out = detect.convert_input(args.input, args.output, args.classes, nhwc=args.nhwc,
                                         size=args.size, **order)
        print(f"{args.input}: {kind}")
    elif args.npz:
        out = npz.convert_npz(args.npz, args.output, args.classes, nhwc=args.nhwc, **order)
    elif all(idx_files):
        out = idx.convert_idx(*idx_files, args.output, args.classes, **order)
    elif any(idx_files):
        names = ["--idx-train-images", "--idx-train-labels", "--idx-test-images", "--idx-test-labels"]
        missing = [n for n, f in zip(names, idx_files) if not f]
        raise ValueError(f"convert: IDX input also needs {', '.join(missing)}")
    else:
        raise ValueError("convert: give INPUT (an .npz or a folder), --npz F or the four --idx-* files")
    print(f"wrote {out} in {time.perf_counter() - t0:.1f}s")
    _print_info(out)


def _synth(args: argparse.Namespace) -> None:
    from psgd.data import synth
    t0 = time.perf_counter()
    if args.sparse:
        from psgd.data.synth_sparse import write_sparse_synthetic
        out = write_sparse_synthetic(args.output, args.train, args.test, args.features, args.classes,
                                     args.nnz, args.seed)
    else:
        out = synth.write_synthetic(args.output, args.train, args.test, args.seed,
                                   channels=args.channels)
    print(f"wrote {out} in {time.perf_counter() - t0:.1f}s")
    _print_info(out)


def _text(args: argparse.Namespace) -> None:
    from psgd.data.text import convert_text
    t0 = time.perf_counter()
    out = convert_text(args.folder, args.output, args.test_fraction, args.seed, args.min_df)
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
    if info["channel_mean"] is not None:
        print(f"  then per channel (x_float - mean) / std: mean "
              f"{' '.join(f'{v:.4g}' for v in info['channel_mean'])}, std "
              f"{' '.join(f'{v:.4g}' for v in info['channel_std'])}")
    for split in ("train", "test"):
        s = info[split]
        comp = f"{s['compression']}" + (f" {s['compression_opts']}" if s["compression_opts"] is not None else "")
        print(f"  {split}: x {s['x_shape']} {s['x_dtype']}, y {s['y_dtype']}, "
              f"chunks {s['chunks']}, compression {comp if s['compression'] else 'none'}")
        counts = s["class_counts"]
        n = max(1, s["n"])
        balance = "  ".join(f"{c}:{k}" for c, k in enumerate(counts))
        print(f"    classes {balance}  (min {min(counts) / n:.1%}, max {max(counts) / n:.1%})")
        _print_order(info, split)


def _print_order(info: dict, split: str) -> None:
    """The class mix per block of rows, and a warning when the classes are clustered."""
    from psgd.data.order import MIXING_WARN
    o = info[split]["order"]
    stated = info["row_order"] or "not recorded"
    if info["row_order"] == "shuffled":
        stated += f" (shuffle seed {info['shuffle_seed']})"
    w = o["worst"]
    print(f"    order: {stated}; {o['blocks']} blocks of {o['block']} rows, class mixing "
          f"{o['mixing']:.3f} (block class entropy / a shuffled file's); fewest classes in a "
          f"block: {w['classes']} in rows [{w['rows'][0]}, {w['rows'][1]}), largest "
          f"{w['top_share']:.0%}")
    if o["clustered"]:
        print(f"    warning: /{split} rows are clustered by class (mixing {o['mixing']:.3f} < "
              f"{MIXING_WARN}); reconvert without --keep-order to store them shuffled (training deals "
              f"rows to workers either way, but --eval-samples takes the first /test rows)")
