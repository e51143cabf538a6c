"""The cifar-cnn preset, trained as a worker trains it (its shard reader with --augment, dropout
reseeded per step, batch-norm statistics recomputed for evaluation), learns the colour synthetic set."""
import numpy as np

from psgd.data import layout
from psgd.data.reader import ShardReader
from psgd.data.synth import make_synthetic
from psgd.nn.model import build_model
from psgd.nn.optim import make_optimizer

CLASSES = 4   # of the synthetic set's 10: enough to show learning in a test's time


def test_cifar_cnn_with_augmentation_learns_the_colour_synthetic_set(tmp_path):
    x, y, xt, yt = make_synthetic(3000, 600, seed=0, channels=3)
    keep, keep_t = y < CLASSES, yt < CLASSES
    path = layout.write_dataset(tmp_path / "colour.h5", x[keep], y[keep], xt[keep_t], yt[keep_t],
                                n_classes=CLASSES, normalize=True)
    reader = ShardReader(path, 0, 1, 32, seed=0, augment=True)
    model = build_model("cifar-cnn", seed=0, input_shape=reader.input_shape, n_classes=CLASSES)
    model.set_calibration(reader.calibration_rows(128)[0])
    opt = make_optimizer("momentum", model.n_params)
    x_test, y_test = reader.test_set()
    first = model.evaluate(x_test, y_test)[0]
    for step in range(120):
        model.reseed(0, step)
        model.loss_and_grad(*reader.batch(step))
        opt.step(model.params, model.grad, 0.01)
    loss, acc = model.evaluate(x_test, y_test)
    assert np.isfinite(loss) and loss < first
    assert acc > 0.4, acc   # chance is 0.25; 0.55-0.56 seen
