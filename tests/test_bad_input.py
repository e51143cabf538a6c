"""Bad input through the real CLI: one clear line, a non-zero exit, no traceback, no hang."""
import re
import shutil

import h5py
import numpy as np
import pytest

from psgd.data import make_synthetic, write_dataset
from psgd.nn.model import build_model
from psgd.run.checkpoint import Checkpoint, save_checkpoint

MLP = "mlp:784-16-10"
TIMEOUT = 60


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A good dataset and checkpoint, and a broken variant of each for every case below."""
    d = tmp_path_factory.mktemp("bad")
    good = d / "good.h5"
    x, y, xt, yt = make_synthetic(200, 50, seed=0)
    write_dataset(good, x, y, xt, yt, n_classes=10, scale=1 / 255, offset=0.0, source="test")

    def variant(name, edit):
        path = d / name
        shutil.copy(good, path)
        with h5py.File(path, "r+") as f:
            edit(f)
        return path

    def replace(f, name, data):
        del f[name]
        f.create_dataset(name, data=data)

    out = {"good": good, "dir": d}
    raw = good.read_bytes()
    (d / "truncated.h5").write_bytes(raw[:len(raw) // 2])
    out["truncated"] = d / "truncated.h5"
    (d / "text.h5").write_text("this is not HDF5\n")
    out["text"] = d / "text.h5"
    out["no_test_y"] = variant("no_test_y.h5", lambda f: f.__delitem__("test/y"))
    out["xy_mismatch"] = variant("xy_mismatch.h5",
                                 lambda f: replace(f, "train/y", f["train/y"][:150]))
    out["label_10"] = variant("label_10.h5", lambda f: replace(
        f, "train/y", np.where(np.arange(200) == 7, 10, f["train/y"][()])))
    out["label_neg"] = variant("label_neg.h5", lambda f: replace(
        f, "test/y", np.where(np.arange(50) == 3, -1, f["test/y"][()]).astype(np.int32)))
    out["y_float"] = variant("y_float.h5", lambda f: replace(
        f, "train/y", f["train/y"][()].astype(np.float32)))

    def nan_x(f):
        xf = f["train/x"][()].astype(np.float32) / 255
        xf[5, 0, 3, 3] = np.nan
        replace(f, "train/x", xf)
        f.attrs["scale"] = 1.0
    out["nan_x"] = variant("nan_x.h5", nan_x)
    out["x_1d"] = variant("x_1d.h5", lambda f: replace(f, "train/x", np.zeros(200, np.uint8)))
    out["x_int16"] = variant("x_int16.h5", lambda f: replace(
        f, "train/x", f["train/x"][()].astype(np.int16)))
    out["no_n_classes"] = variant("no_n_classes.h5", lambda f: f.attrs.__delitem__("n_classes"))
    out["scale_str"] = variant("scale_str.h5", lambda f: f.attrs.__setitem__("scale", "big"))
    out["classes_0"] = variant("classes_0.h5", lambda f: f.attrs.__setitem__("n_classes", 0))
    out["classes_12"] = variant("classes_12.h5", lambda f: f.attrs.__setitem__("n_classes", 12))
    out["version_9"] = variant("version_9.h5", lambda f: f.attrs.__setitem__("format_version", 9))
    out["img32"] = d / "img32.h5"
    write_dataset(out["img32"], np.zeros((200, 1, 32, 32), np.uint8), y,
                  np.zeros((50, 1, 32, 32), np.uint8), yt, n_classes=10, scale=1 / 255,
                  offset=0.0, source="test")

    model = build_model(MLP, seed=0)
    ck = Checkpoint(params=model.params.copy(), model_spec=MLP, step=2, optimizer="sgd")
    out["ck_good"] = save_checkpoint(d / "ck_good", ck)
    (d / "ck_garbage.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(range(256)) * 8)
    out["ck_garbage"] = d / "ck_garbage.h5"

    def ck_variant(name, edit):
        path = d / name
        shutil.copy(out["ck_good"], path)
        with h5py.File(path, "r+") as f:
            edit(f)
        return path
    out["ck_no_params"] = ck_variant("ck_no_params.h5", lambda f: f.__delitem__("params"))
    out["ck_n_params"] = ck_variant("ck_n_params.h5", lambda f: f.attrs.__setitem__("n_params", 5))
    out["ck_nan"] = ck_variant("ck_nan.h5", lambda f: replace(
        f, "params", np.full(model.n_params, np.nan, np.float32)))
    out["ck_version"] = ck_variant("ck_version.h5",
                                   lambda f: f.attrs.__setitem__("format_version", 7))
    out["ck_bad_config"] = ck_variant("ck_bad_config.h5",
                                      lambda f: f.attrs.__setitem__("config", "{not json"))
    other = build_model("mlp:784-8-10", seed=0)
    out["ck_other"] = save_checkpoint(d / "ck_other", Checkpoint(
        params=other.params.copy(), model_spec="mlp:784-8-10", step=2, optimizer="sgd"))
    out["ck_momentum"] = save_checkpoint(d / "ck_momentum", Checkpoint(
        params=model.params.copy(), model_spec=MLP, step=2, optimizer="momentum",
        opt_state={"velocity": np.zeros(model.n_params, np.float32)}))
    (d / "ck_empty").mkdir()
    out["ck_empty"] = d / "ck_empty"

    def toml(name, text):
        (d / name).write_text(text)
        return d / name
    out["toml_syntax"] = toml("syntax.toml", "lr = = 0.1\n")
    out["toml_unknown"] = toml("unknown.toml", "learning_rate = 0.1\n")
    out["toml_type"] = toml("type.toml", 'lr = "fast"\n')
    out["toml_int"] = toml("int.toml", "batch_size = 1.5\n")
    out["toml_table"] = toml("table.toml", "train = 3\n")
    out["bad_log"] = d / "bad.jsonl"
    out["bad_log"].write_text("{not json\n")
    return out


def train(files, *flags):
    return ["-m", "psgd", "train", "--quiet", "--model", MLP, "--optimizer", "sgd",
            "--batch-size", "16", "--steps", "4", *map(str, flags)]


def data_flags(key):
    return lambda f: train(f, "--data", f[key], "--protocol", "allreduce")


def resume_flags(key):
    return lambda f: train(f, "--data", f["good"], "--protocol", "allreduce", "--resume", f[key])


def config_flags(key):
    return lambda f: train(f, "--data", f["good"], "--protocol", "allreduce", "--config", f[key])


def flags(*extra):
    return lambda f: train(f, "--data", f["good"], *extra)


# (id, ranks, argv from files, text the one error line must contain)
CASES = [
    # TOML configs
    ("toml-syntax", 2, config_flags("toml_syntax"), "not valid TOML"),
    ("toml-unknown-key", 2, config_flags("toml_unknown"), "unknown setting 'learning_rate'"),
    ("toml-wrong-type", 1, config_flags("toml_type"), "lr must be float"),
    ("toml-float-for-int", 1, config_flags("toml_int"), "batch_size must be int"),
    ("toml-train-not-table", 1, config_flags("toml_table"), "[train] must be a table"),
    ("toml-missing", 1, lambda f: train(f, "--data", f["good"], "--config", f["dir"] / "no.toml"),
     "no such file"),
    # flags
    ("flag-lr-not-number", 2, flags("--lr", "fast"), "invalid float value"),
    ("flag-lr-nan", 1, flags("--lr", "nan", "--protocol", "allreduce"), "--lr must be a positive"),
    ("flag-batch-0", 1, flags("--batch-size", "0", "--protocol", "allreduce"),
     "--batch-size must be >= 1"),
    ("flag-protocol", 1, flags("--protocol", "gosip"), "--protocol 'gosip' is not one of"),
    ("flag-optimizer", 1, flags("--optimizer", "rmsprop", "--protocol", "allreduce"),
     "--optimizer 'rmsprop' is not one of"),
    ("flag-momentum", 1, flags("--momentum", "1.5", "--protocol", "allreduce"),
     "--momentum must be in [0, 1)"),
    ("flag-epochs-and-steps", 1, flags("--epochs", "1", "--protocol", "allreduce"),
     "give --epochs or --steps, not both"),
    ("flag-ckpt-every-no-dir", 1, flags("--checkpoint-every", "5", "--protocol", "allreduce"),
     "--checkpoint-every needs --checkpoint-dir"),
    ("flag-stall-timeout", 1, flags("--stall-timeout", "0", "--protocol", "allreduce"),
     "--stall-timeout and --stall-abort must be > 0"),
    ("flag-allreduce-servers", 2, flags("--protocol", "allreduce", "--servers", "1"),
     "--protocol allreduce has no servers"),
    ("flag-too-many-servers", 2, flags("--protocol", "asp", "--servers", "2"),
     "--servers 2 leaves no worker"),
    ("flag-staleness-negative", 2, flags("--protocol", "ssp", "--staleness", "-1"),
     "--staleness must be >= 0"),
    ("flag-unknown", 1, flags("--learning-rate", "0.1"), "unrecognized arguments"),
    ("gossip-servers", 2, flags("--protocol", "gossip", "--servers", "1"),
     "--protocol gossip has no servers"),
    ("gossip-topology-unknown", 1, flags("--protocol", "gossip", "--topology", "star"),
     "--topology 'star' is not one of ring, torus, exponential, complete"),
    ("gossip-torus-prime", 3, flags("--protocol", "gossip", "--topology", "torus"),
     "--topology torus needs W = R x C workers with R, C >= 2, but W = 3"),
    ("topology-not-decentralized", 1, flags("--protocol", "allreduce", "--topology", "ring"),
     "--topology applies to --protocol gossip or adpsgd only"),
    ("adpsgd-one-worker", 1, flags("--protocol", "adpsgd"), "adpsgd needs at least 2 workers"),
    ("flag-model-spec", 1, flags("--model", "resnet", "--protocol", "allreduce"), "resnet"),
    ("model-spec-shape", 2, lambda f: train(f, "--data", f["good"], "--protocol", "allreduce",
                                            "--model", "conv:8x3-pool:2-dense:10"),
     "token 3 'dense:10' follows a 13x13x8 image; put 'flatten' or 'gap' before it"),
    # missing files
    ("data-missing", 2, lambda f: train(f, "--data", f["dir"] / "none.h5"), "no such file"),
    ("data-none", 1, lambda f: train(f), "no dataset: pass --data"),
    ("resume-missing", 1, lambda f: train(f, "--data", f["good"], "--protocol", "allreduce",
                                          "--resume", f["dir"] / "gone"),
     "no such file or directory"),
    ("resume-empty-dir", 2, resume_flags("ck_empty"), "no checkpoint (ckpt-*.h5)"),
    # corrupted or malformed HDF5 datasets
    ("data-truncated", 2, data_flags("truncated"), "truncated.h5"),
    ("data-not-hdf5", 1, data_flags("text"), "not an HDF5 file"),
    ("data-missing-test-y", 2, data_flags("no_test_y"), "missing dataset /test/y"),
    ("data-xy-mismatch", 2, data_flags("xy_mismatch"),
     "/train/x has 200 rows but /train/y has 150"),
    ("data-label-out-of-range", 2, data_flags("label_10"), "label 10 at row 7 is outside [0, 10)"),
    ("data-label-negative", 1, data_flags("label_neg"), "label -1 at row 3 is outside [0, 10)"),
    ("data-float-labels", 1, data_flags("y_float"), "/train/y must be integer class ids"),
    ("data-nan-x", 2, data_flags("nan_x"), "contains NaN or Inf"),
    ("data-x-1d", 1, data_flags("x_1d"), "/train/x has shape (200,)"),
    ("data-x-int16", 1, data_flags("x_int16"), "/train/x has dtype int16"),
    ("data-no-n-classes", 1, data_flags("no_n_classes"), "missing root attribute 'n_classes'"),
    ("data-scale-string", 1, data_flags("scale_str"), "root attribute 'scale' must be a number"),
    ("data-zero-classes", 1, data_flags("classes_0"), "n_classes must be a positive integer"),
    ("data-class-count-mismatch", 2, data_flags("classes_12"), "has 10 outputs"),
    ("data-format-version", 1, data_flags("version_9"), "format_version 9 is not supported"),
    # corrupted or foreign checkpoints
    ("ckpt-garbage", 2, resume_flags("ck_garbage"), "not a readable HDF5 file"),
    ("ckpt-no-params", 1, resume_flags("ck_no_params"), "missing dataset /params"),
    ("ckpt-wrong-n-params", 1, resume_flags("ck_n_params"), "attribute n_params says 5"),
    ("ckpt-nan-params", 2, resume_flags("ck_nan"), "/params holds non-finite values"),
    ("ckpt-format-version", 1, resume_flags("ck_version"), "format version 7 is not supported"),
    ("ckpt-bad-config-json", 1, resume_flags("ck_bad_config"), "'config' is not valid JSON"),
    ("ckpt-other-model", 2, resume_flags("ck_other"), "is of model 'mlp:784-8-10'"),
    ("ckpt-other-optimizer", 1, resume_flags("ck_momentum"), "resume with --optimizer momentum"),
    ("ckpt-past-the-end", 1, lambda f: train(f, "--data", f["good"], "--protocol", "allreduce",
                                             "--resume", f["ck_good"], "--steps", 2),
     "at or past the run's 2 steps"),
    # wrong shapes and sizes
    ("shape-32x32-for-lenet", 2, lambda f: train(f, "--data", f["img32"], "--model", "lenet",
                                                 "--protocol", "allreduce"), "inputs of shape"),
    ("shape-mlp-input", 1, flags("--model", "mlp:100-10", "--protocol", "allreduce"),
     "inputs of shape"),
    ("batch-bigger-than-slice", 2, flags("--batch-size", "150", "--protocol", "allreduce"),
     "fewer than --batch-size 150"),
    ("hogwild-adam", 2, flags("--protocol", "hogwild", "--optimizer", "adam"), "adam"),
    ("hold-hot-zero", 2, flags("--protocol", "hogwild", "--hold-hot", "0"),
     "--hold-hot must be >= 1, got 0"),
    ("hold-hot-under-ssp", 2, flags("--protocol", "ssp", "--hold-hot", "4"),
     "--hold-hot applies to --protocol hogwild on sparse data, not ssp"),
    ("hold-hot-on-dense-data", 2, flags("--protocol", "hogwild", "--hold-hot", "4"),
     "--hold-hot applies to a sparse model"),
    # the other commands
    ("data-info-missing", 1, lambda f: ["-m", "psgd", "data", "info", f["dir"] / "none.h5"],
     "does not exist"),
    ("data-info-truncated", 1, lambda f: ["-m", "psgd", "data", "info", f["truncated"]],
     "truncated.h5"),
    ("data-convert-nothing", 1, lambda f: ["-m", "psgd", "data", "convert", "-o",
                                           f["dir"] / "o.h5"], "give INPUT (an .npz or a folder), --npz F or the four"),
    ("data-synth-under-a-file", 1, lambda f: ["-m", "psgd", "data", "synth", "-o",
                                              f["text"] / "sub" / "o.h5"], "is not a directory"),
    ("log-exists", 1, lambda f: train(f, "--data", f["good"], "--protocol", "allreduce",
                                      "--log", f["bad_log"]), "exists (another run's log)"),
    ("plot-missing-log", 1, lambda f: ["-m", "psgd", "plot", f["dir"] / "none.jsonl", "-o",
                                       f["dir"] / "p.png"], "none.jsonl"),
    ("plot-garbage-log", 1, lambda f: ["-m", "psgd", "plot", f["bad_log"], "-o",
                                       f["dir"] / "p.png"], "bad.jsonl"),
    ("plot-an-hdf5-file", 1, lambda f: ["-m", "psgd", "plot", f["good"]], "good.h5: not a psgd"),
]


@pytest.mark.parametrize("ranks, argv, message", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_bad_input_gives_one_clear_line(mpirun, files, ranks, argv, message):
    proc = mpirun(ranks, argv(files), timeout=TIMEOUT, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    # psgd's one line (argparse's usage error reads "psgd train: error: ..."); MPICH may add
    # its own "application called MPI_Abort" line when a rank fails after set-up
    lines = [line for line in proc.stderr.splitlines() if line.startswith("psgd")]
    assert len(lines) == 1, proc.stderr
    assert re.match(r"psgd( \w+)?: error: ", lines[0]), proc.stderr
    assert message in lines[0], proc.stderr
    others = [line for line in proc.stderr.splitlines()
              if line.strip() and not line.startswith("psgd") and "MPI_Abort" not in line]
    assert not others, proc.stderr


def test_there_are_at_least_30_cases():
    assert len({c[0] for c in CASES}) == len(CASES) >= 30
