"""`psgd train --tensorboard` and `psgd plot --tensorboard`: event files TensorBoard reads back."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("tensorboardX")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

from psgd.data import make_synthetic, write_dataset  # noqa: E402
from psgd.run.metrics import read_log  # noqa: E402
from psgd.run.tb_events import EventWriter  # noqa: E402


def load(logdir):
    """Every scalar and histogram of the event files in ``logdir``, as TensorBoard reads them."""
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={
        event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    return {e.step: e.value for e in acc.Scalars(tag)}


def records():
    return [
        {"kind": "config", "time": 0.0, "protocol": "asp", "model": "lenet", "n_workers": 2},
        {"kind": "step", "time": 1.0, "step": 10, "loss": 2.0, "train_accuracy": 0.25, "lr": 0.1,
         "samples_per_s": 900.0, "est_global_samples_per_s": 1800.0, "staleness": 1,
         "compute_s": 0.5, "push_s": 0.1, "push_bytes_per_step": 4000.0,
         "compression_ratio": 7.5},
        {"kind": "step", "time": 2.0, "step": 20, "loss": 1.5, "train_accuracy": 0.5, "lr": 0.05,
         "samples_per_s": 1000.0, "est_global_samples_per_s": 2000.0, "staleness": 3,
         "consensus_distance": 0.02, "compute_s": 0.4, "push_s": 0.1},
        {"kind": "step", "time": 3.0, "step": 30, "loss": 1.25, "train_accuracy": 0.625,
         "lr": 0.05, "samples_per_s": 1100.0, "est_global_samples_per_s": 2200.0,
         "staleness": 1, "compute_s": 0.4, "push_s": 0.1},
        {"kind": "eval", "time": 3.5, "step": 30, "test_loss": 1.0, "test_accuracy": 0.7},
        {"kind": "summary", "time": 4.0, "steps": 30, "samples_per_s": 1950.0, "wall_s": 4.0,
         "test_accuracy": 0.7, "staleness_histogram": [5, 7, 0, 2], "push_bytes": 4000.0,
         "compression_ratio": 7.5},
    ]


def test_event_writer_scalars_and_histograms_read_back(tmp_path):
    writer = EventWriter(tmp_path)
    for r in records():
        writer.add(r)
    writer.close()
    acc = load(tmp_path)
    tags = acc.Tags()
    assert scalars(acc, "train/loss") == {10: 2.0, 20: 1.5, 30: 1.25}
    assert scalars(acc, "train/lr") == pytest.approx({10: 0.1, 20: 0.05, 30: 0.05})
    assert scalars(acc, "throughput/samples_per_s") == {10: 1800.0, 20: 2000.0, 30: 2200.0}
    assert scalars(acc, "gossip/consensus_distance") == pytest.approx({20: 0.02})
    assert scalars(acc, "compress/ratio") == {10: 7.5}
    assert scalars(acc, "bytes/pushed_per_step") == {10: 4000.0}
    assert scalars(acc, "test/accuracy") == pytest.approx({30: 0.7})
    assert scalars(acc, "time/compute") == pytest.approx({10: 0.5, 20: 0.4, 30: 0.4})
    assert {t for t in tags["scalars"] if t.startswith("time/")} == {"time/compute", "time/push"}
    assert tags["tensors"] == ["config/text_summary"]
    # the summary's histogram: every update of the run by staleness, as the counts given
    (final,) = acc.Histograms("staleness/all_updates")
    h = final.histogram_value
    assert final.step == 30 and h.num == 14 and (h.min, h.max) == (0, 3)
    assert list(h.bucket) == [5, 7, 0, 2] and h.sum == 7 + 3 * 2
    # the lead's steps so far at each step record: staleness 1, then 1 and 3, then 1, 3, 1
    lead = {e.step: list(e.histogram_value.bucket) for e in
            acc.Histograms("staleness/lead_worker_steps")}
    assert lead == {10: [0, 1], 20: [0, 1, 0, 1], 30: [0, 2, 0, 1]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One asp run with qsgd pushes, logged as JSON lines and as event files."""
    from conftest import run_mpi
    tmp = tmp_path_factory.mktemp("tb")
    x, y, xt, yt = make_synthetic(n_train=512, n_test=128, seed=0)
    write_dataset(tmp / "d.h5", x, y, xt, yt)
    run_mpi(3, ["-m", "psgd", "train", "--data", tmp / "d.h5", "--model", "mlp:784-32-10",
                "--protocol", "asp", "--compress", "qsgd:4", "--steps", "30", "--log-every",
                "5", "--eval-every", "15", "--log", tmp / "run.jsonl", "--tensorboard",
                tmp / "tb", "--quiet"], timeout=180)
    return tmp


def test_train_writes_event_files_with_the_logs_numbers(trained):
    steps = [r for r in read_log(trained / "run.jsonl") if r["kind"] == "step"]
    acc = load(trained / "tb")
    for field, tag in (("loss", "train/loss"), ("lr", "train/lr"),
                       ("compression_ratio", "compress/ratio"),
                       ("push_bytes_per_step", "bytes/pushed_per_step"),
                       ("est_global_samples_per_s", "throughput/samples_per_s")):
        assert scalars(acc, tag) == pytest.approx({r["step"]: r[field] for r in steps}, rel=1e-6)
    assert set(scalars(acc, "test/accuracy")) == {15, 30}
    summary = read_log(trained / "run.jsonl")[-1]
    (final,) = acc.Histograms("staleness/all_updates")
    assert list(final.histogram_value.bucket) == summary["staleness_histogram"]
    assert len(acc.Histograms("staleness/lead_worker_steps")) == len(steps)


def test_plot_converts_a_log_to_the_same_scalars(trained, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "psgd", "plot", "--tensorboard",
                           str(trained / "run.jsonl"), str(tmp_path / "tb")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    converted, live = load(tmp_path / "tb" / "run"), load(trained / "tb")
    for tag in ("train/loss", "train/accuracy", "compress/ratio", "test/loss"):
        assert scalars(converted, tag) == pytest.approx(scalars(live, tag)), tag
    assert ([list(e.histogram_value.bucket) for e in converted.Histograms("staleness/all_updates")]
            == [list(e.histogram_value.bucket) for e in live.Histograms("staleness/all_updates")])


def one_line_error(proc, *words):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert all(w in lines[0] for w in words), lines[0]


def test_tensorboard_on_a_file_is_one_line(tmp_path):
    x, y, xt, yt = make_synthetic(n_train=64, n_test=32, seed=0)
    write_dataset(tmp_path / "d.h5", x, y, xt, yt)
    (tmp_path / "taken").write_text("a file\n")
    proc = subprocess.run([sys.executable, "-m", "psgd", "train", "--data",
                           str(tmp_path / "d.h5"), "--protocol", "allreduce", "--steps", "2",
                           "--tensorboard", str(tmp_path / "taken")],
                          capture_output=True, text=True, timeout=120)
    one_line_error(proc, "--tensorboard", "taken", "is a file")
    assert (tmp_path / "taken").read_text() == "a file\n"


@pytest.mark.parametrize("content", ['{"event": "login", "user": 3}\n', "time,loss\n0,1.5\n",
                                     '{"kind": "row", "x": 1}\n'])
def test_plot_tensorboard_of_a_log_that_is_not_psgds_is_one_line(tmp_path, content):
    (tmp_path / "other.jsonl").write_text(content)
    proc = subprocess.run([sys.executable, "-m", "psgd", "plot", "--tensorboard",
                           str(tmp_path / "other.jsonl"), str(tmp_path / "tb")],
                          capture_output=True, text=True, timeout=120)
    one_line_error(proc, "other.jsonl", "not")
    assert not (tmp_path / "tb" / "other").exists()


def test_plot_tensorboard_needs_logs_and_a_directory(tmp_path):
    log = tmp_path / "run.jsonl"
    log.write_text(json.dumps(records()[0]) + "\n")
    proc = subprocess.run([sys.executable, "-m", "psgd", "plot", "--tensorboard", str(log)],
                          capture_output=True, text=True, timeout=120)
    one_line_error(proc, "LOG... DIR")
    proc = subprocess.run([sys.executable, "-m", "psgd", "plot", "--tensorboard", str(log),
                           str(log)], capture_output=True, text=True, timeout=120)
    one_line_error(proc, "is a file")
