"""A model's per-unit profile for the planner: forward and backward seconds (per call and per
sample, from two batch sizes), activation and parameter bytes per cuttable unit, the optimizer step's seconds per byte, the compressors'
codecs, the spatial split's reach, and the bytes a rank holds besides its training state;
saved as JSON."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from psgd.errors import UsageError

FORMAT = "psgd-profile/6"        # /2: base_bytes; /3: seconds per call, scratch; /4: ratios per part count;
                                 # /5: crowd ratios, seconds per multiply-add; /6: spatial ratios
                                 # timed with the float32 split batch norm
SPLIT_LAYERS = ("Dense", "Conv2D")      # layers whose parameters --tensor splits


@dataclass(frozen=True)
class Unit:
    """One cuttable unit (:func:`psgd.pipeline.partition.units`): ``forward_s`` and
    ``backward_s`` per sample of a batch, ``*_fixed_s`` per call whatever its batch (mostly
    reading the weights: a small batch runs a GEMM slower per sample); bytes per sample,
    ``scratch_fixed`` bytes whatever the batch.

    ``split_bytes``: the part of ``param_bytes`` that --tensor divides among its parts;
    ``width``: the narrowest split layer's output width (no more parts than that).
    """

    name: str
    forward_s: float
    backward_s: float
    in_bytes: int
    out_bytes: int
    param_bytes: int
    split_bytes: int = 0
    width: int = 0
    forward_fixed_s: float = 0.0
    backward_fixed_s: float = 0.0
    scratch_bytes: int = 0
    scratch_fixed: int = 0

    def scratch_at(self, batch: int) -> int:
        """Bytes of the layers' kept buffers beyond the unit's output for a batch of ``batch``
        (input gradients, im2col columns, Winograd tiles, pooling's argmax)."""
        return self.scratch_fixed + batch * self.scratch_bytes

    def forward_at(self, batch: int) -> float:
        return self.forward_fixed_s + batch * self.forward_s

    def backward_at(self, batch: int) -> float:
        return self.backward_fixed_s + batch * self.backward_s


@dataclass(frozen=True)
class Profile:
    """A model spec's units, the batch they were timed at, the optimizer step's s/byte, and
    ``base_bytes``: a rank's resident bytes beyond its training state (:mod:`psgd.plan.base`);
    ``codecs``: compressor spec -> [ratio, encode s/byte, decode s/byte, summable in a ring];
    ``spatial_units``: the leading units --spatial splits by height, into at most
    ``spatial_max`` parts; ``spatial_ratios``: parts -> a --spatial part's step over its
    units' share (:func:`psgd.plan.tensor_time.spatial_ratio`); ``tensor_ratios``: parts -> a
    --tensor part's step over its units' share (:func:`psgd.plan.tensor_time.split_ratio`),
    ``tensor_ratio`` the one at two parts; ``input_shape`` and ``n_classes``: the model's, as
    it was built (on a dataset's shape, for a spec that takes it from the data);
    ``crowd_ratios``: ``serial``, ``tensor T``, ``spatial P`` -> that step's slow-down with two
    copies a core beyond the halved time (:func:`psgd.plan.crowd.crowd_ratio`); ``mac_s``: the
    units' seconds per multiply-add, forward and backward (:func:`mac_seconds`); ``load`` and
    ``cores``: the load average and the cores when it was measured (:func:`loaded`)."""

    spec: str
    batch: int
    units: tuple[Unit, ...]
    step_s_per_byte: float
    base_bytes: int
    codecs: dict = field(default_factory=dict, hash=False)
    spatial_units: int = 0
    spatial_max: int = 1
    spatial_ratios: dict = field(default_factory=dict, hash=False)
    tensor_ratio: float = 1.0
    tensor_ratios: dict = field(default_factory=dict, hash=False)
    input_shape: tuple = ()        # per sample, as the model was built (a dataset's, or its default)
    n_classes: int = 0
    crowd_ratios: dict = field(default_factory=dict, hash=False)
    mac_s: float = 0.0
    load: float = 0.0              # the 1-minute load average when profiling began
    cores: int = 0                 # the cores the profiling process could use

    @property
    def param_bytes(self) -> int:
        return sum(u.param_bytes for u in self.units)

    @property
    def compute_s(self) -> float:
        """Forward plus backward seconds per sample, the whole model on one core."""
        return sum(u.forward_s + u.backward_s for u in self.units)

    def compute_at(self, batch: int) -> float:
        """Forward plus backward seconds of a batch of ``batch``, the whole model on one core."""
        return sum(u.forward_at(batch) + u.backward_at(batch) for u in self.units)


def _unit_info(model, lo: int, hi: int) -> tuple[str, int, int]:
    layers = model.layers[lo:hi]
    split = [la for la in layers if type(la).__name__ in SPLIT_LAYERS]
    split_bytes = 4 * sum(int(np.prod(s)) for la in split for _, s in la.param_shapes())
    width = min((int(la.out_shape[-1]) for la in split), default=0)   # units, or filters (HxWxF)
    return "+".join(type(la).__name__.lower() for la in layers), split_bytes, width


def _time_units(model, x, spans) -> tuple[list[float], list[float], list[np.ndarray]]:
    """Each span's forward and backward seconds on ``x``; no input gradient up to the first
    layer with parameters, as the model's own backward."""
    acts, fw, bw, a = [], [], [0.0] * len(spans), x
    for lo, hi in spans:
        acts.append(a)
        t = time.perf_counter()
        for layer in model.layers[lo:hi]:
            a = layer.forward(a)
        fw.append(time.perf_counter() - t)
    dy = np.ones_like(a) / a.size
    for j in range(len(spans) - 1, -1, -1):
        lo, hi = spans[j]
        t = time.perf_counter()
        for i in range(hi - 1, lo - 1, -1):
            dy = model.layers[i].backward(dy, need_dx=i > model._first_param_layer)
        bw[j] = time.perf_counter() - t
    return fw, bw, acts + [a]


def _best_times(model, x, spans, repeats: int) -> tuple[np.ndarray, np.ndarray, list]:
    _time_units(model, x, spans)                    # compile, and the buffers of this batch
    fw, bw = np.full(len(spans), np.inf), np.full(len(spans), np.inf)
    for _ in range(repeats):
        f, b, acts = _time_units(model, x, spans)
        fw, bw = np.minimum(fw, f), np.minimum(bw, b)
    return fw, bw, acts


def _scratch(model, spans, acts: list, batch: int) -> list[int]:
    """Each span's layer buffers (:meth:`psgd.nn.layers.Layer._buf`) less its output."""
    held = [sum(b.nbytes for la in model.layers[lo:hi] for b in getattr(la, "_bufs", {}).values())
            for lo, hi in spans]
    return [max(0, h - acts[j + 1].nbytes // acts[j + 1].shape[0] * batch) for j, h in enumerate(held)]


def _affine(small: float, large: float, n: int) -> tuple[float, float]:
    """(per sample, per call) seconds through a call's times at ``n`` and ``2 n`` samples;
    proportional where the two do not give a positive slope and intercept (timing noise)."""
    slope = (large - small) / n
    if slope <= 0 or small - n * slope < 0:
        return large / (2 * n), 0.0
    return slope, small - n * slope


def _step_s_per_byte(n: int, seconds: float = 0.1) -> float:
    from psgd.nn.optim import make_optimizer
    n = max(1, min(n, 1 << 22))
    opt = make_optimizer("momentum", n)
    params, grad = np.zeros(n, np.float32), np.ones(n, np.float32)
    opt.step(params, grad, 0.01)                    # compile
    steps, start = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - start < seconds:
        opt.step(params, grad, 0.01)
        steps += 1
    return (time.perf_counter() - start) / steps / (4 * n)


def profile_model(model, batch: int = 32, repeats: int = 3, seed: int = 0) -> Profile:
    """Time each unit of ``model`` (a :class:`psgd.nn.model.Model`) on random batches of
    ``batch`` and ``2 batch`` samples, best of ``repeats`` after one warm-up pass each; a
    unit's seconds per sample and per call through the two; the compressors' codecs and the
    spatial split's reach. ``base_bytes`` is left 0: :func:`psgd.plan.auto.get_profile`
    measures it (:mod:`psgd.plan.base`). Call it with BLAS on one thread, as a rank runs
    (psgd's command line pins it before numpy loads)."""
    from psgd.pipeline.partition import units
    spans = units(model)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2 * batch, *model.input_shape)).astype(model.dtype)
    model._set_mode("train")
    fw1, bw1, acts = _best_times(model, x[:batch], spans, repeats)
    held1 = _scratch(model, spans, acts, batch)
    fw2, bw2, _ = _best_times(model, x, spans, repeats)
    held2 = _scratch(model, spans, acts, 2 * batch)
    out = []
    for j, (lo, hi) in enumerate(spans):
        name, split_bytes, width = _unit_info(model, lo, hi)
        params = 4 * sum(int(np.prod(s)) for la in model.layers[lo:hi] for _, s in la.param_shapes())
        (fs, ff), (bs, bf) = (_affine(float(a[j]), float(b[j]), batch)
                              for a, b in ((fw1, fw2), (bw1, bw2)))
        per = max(0, held2[j] - held1[j]) // batch
        out.append(Unit(name, fs, bs, acts[j].nbytes // batch, acts[j + 1].nbytes // batch,
                        params, split_bytes, width, ff, bf, per, max(0, held1[j] - batch * per)))
    ratios, reach = _tensor_ratios(model, out, 2 * batch, repeats), _spatial(model, spans)
    x2, y2 = x, np.arange(2 * batch) % model.n_classes
    return Profile(model.spec, batch, tuple(out), _step_s_per_byte(model.n_params), 0,
                   _codecs(model.n_params), *reach, _spatial_ratios(model, out, reach, 2 * batch, repeats),
                   ratios.get(2, 1.0), ratios, tuple(model.input_shape), int(model.n_classes),
                   _crowd_ratios(model, lambda: model.loss_and_grad(x2, y2), ratios, reach, 2 * batch),
                   mac_seconds(model, out))


def loaded(profile: Profile) -> str:
    """One line when ``profile`` was measured on a machine whose load average exceeded its
    cores (other processes took the cores: its times, and the plans' predictions, are off),
    else ""."""
    if profile.cores and profile.load > profile.cores:
        return (f"the profile was measured under load (load average {profile.load:.1f} on "
                f"{profile.cores} cores): its times, and every prediction, may be off by up to "
                f"1.7x; remake it (--profile FILE, removed first) on an idle machine")
    return ""


def macs(layer) -> int:
    """Multiply-adds per sample of a serial layer: its weights at each output position."""
    weights = sum(int(np.prod(s)) for _, s in layer.param_shapes())
    return weights * (int(np.prod(layer.out_shape[:-1])) if len(layer.out_shape) == 3 else 1)


def mac_seconds(model, units) -> float:
    """The units' forward and backward seconds per sample over three times the model's
    multiply-adds per sample (:func:`macs`): the seconds per multiply-add of ``--grid
    auto``'s compute term; 0 for a model without them."""
    n = sum(macs(layer) for layer in model.layers)
    return sum(u.forward_s + u.backward_s for u in units) / (3 * n) if n else 0.0


def _crowd_ratios(model, step, tensor: dict, reach: tuple[int, int], batch: int) -> dict:
    """``serial`` (``step``: the whole model's), ``tensor T`` and ``spatial P`` for the counts
    timed in ``tensor`` and up to ``reach``'s parts -> :func:`psgd.plan.crowd.crowd_ratio`."""
    from psgd.plan.crowd import crowd_ratio
    from psgd.plan.tensor_time import TIMED, part_step
    from psgd.tensor.conv import split_tensor
    from psgd.tensor.spatial import split_spatial
    out = {"serial": crowd_ratio(step)}
    for t in tensor:
        out[f"tensor {t}"] = crowd_ratio(part_step(model, split_tensor, t, batch))
    for p in [p for p in TIMED if reach[0] and p <= reach[1]]:
        out[f"spatial {p}"] = crowd_ratio(part_step(model, split_spatial, p, batch))
    return out


def _tensor_ratios(model, units, batch: int, repeats: int) -> dict:
    """Parts -> :func:`psgd.plan.tensor_time.split_ratio` for each timed count the split
    layers allow (none without split layers)."""
    from psgd.plan.tensor_time import TIMED, split_ratio
    split = [u for u in units if u.split_bytes]
    return {t: split_ratio(model, units, batch, repeats, t) for t in TIMED
            if split and t <= min(u.width for u in split)}


class _Group:
    """A communicator's size and rank, no more: enough to lay out a split without MPI traffic."""

    def __init__(self, size: int) -> None:
        self.size = size

    def Get_size(self) -> int:
        return self.size

    def Get_rank(self) -> int:
        return 0


def _spatial(model, spans, widest: int = 16) -> tuple[int, int]:
    """(the leading units psgd.tensor.spatial splits by height, the most parts that split all
    of them, up to ``widest``); (0, 1) for a model without an image input."""
    names = [type(la).__name__ for la in model.layers]
    if "ChannelsLast" not in names:
        return 0, 1
    from psgd.nn.layers import AvgPool2D, ChannelsLast, Conv2D, Elementwise, MaxPool2D
    from psgd.nn.norm import BatchNorm
    from psgd.tensor.spatial import height_split
    kinds = (ChannelsLast, Conv2D, MaxPool2D, AvgPool2D, BatchNorm, Elementwise)
    end = next((i for i, la in enumerate(model.layers) if not isinstance(la, kinds)),
               len(model.layers))
    count, most = sum(hi <= end for _, hi in spans), 1
    for parts in range(2, widest + 1):
        try:
            if height_split(model.layers, _Group(parts))[1] < end:
                break     # a part thinner than a kernel: the rest would run whole
        except ValueError:
            break
        most = parts
    return count, most


def _spatial_ratios(model, units, reach: tuple[int, int], batch: int, repeats: int) -> dict:
    """Parts -> :func:`psgd.plan.tensor_time.spatial_ratio` for each timed count the split
    reaches (``reach``: :func:`_spatial`'s)."""
    from psgd.plan.tensor_time import TIMED, spatial_ratio
    count, most = reach
    return {p: spatial_ratio(model, units, count, batch, p, repeats) for p in TIMED if count and p <= most}


def _codecs(n_params: int) -> dict:
    from psgd.plan.codec import SEARCHED, measure_compression
    out = {}
    for spec in SEARCHED:
        c = measure_compression(spec, 512, n_params, seconds=0.1)
        out[spec] = [c.ratio, c.encode_s, c.decode_s, c.ring]
    return out


def save(profile: Profile, path: str) -> None:
    data = {"format": FORMAT, **asdict(profile)}
    with open(path, "w") as f:
        json.dump(data, f, indent=1)


def load(path: str) -> Profile:
    """The profile saved at ``path``; UsageError in one line when it is missing or malformed."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--profile {path}: cannot read a JSON profile ({exc})") from None
    try:
        if data.pop("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        units = tuple(Unit(**u) for u in data.pop("units"))
        data["input_shape"] = tuple(data.get("input_shape", ()))
        for key in ("spatial_ratios", "tensor_ratios"):
            data[key] = {int(k): float(v) for k, v in data.get(key, {}).items()}
        data["crowd_ratios"] = {str(k): float(v) for k, v in data.get("crowd_ratios", {}).items()}
        profile = Profile(units=units, **data)
        bad = [u.name for u in units if min(u.forward_s, u.backward_s, u.forward_fixed_s,
                                            u.backward_fixed_s, u.in_bytes, u.out_bytes,
                                            u.param_bytes, u.scratch_bytes, u.scratch_fixed) < 0]
        ratios = [*profile.spatial_ratios.values(), *profile.tensor_ratios.values(), profile.tensor_ratio,
                  *profile.crowd_ratios.values()]
        if not units or bad or profile.batch < 1 or not profile.step_s_per_byte >= 0 \
                or profile.base_bytes < 0 or not all(0 < r < np.inf for r in ratios) \
                or not 0 <= profile.mac_s < np.inf:
            raise ValueError("empty, or a negative time, size or ratio" + (f" in {bad[0]}" if bad else ""))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UsageError(f"--profile {path}: not a psgd profile ({exc}); make one with "
                         f"psgd plan --auto --model SPEC --profile {path}") from None
    return profile
