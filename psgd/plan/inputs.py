"""What `psgd plan` reads from its flags: a bandwidth, the model a spec names, the bytes of a
dataset's training split."""
from __future__ import annotations

from psgd.errors import PsgdError

_UNITS = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str, flag: str = "--bandwidth") -> float:
    """Bytes per second of ``10gbit``, ``100gbit``, ``500mbit`` (or a plain number of bits/s);
    ``flag`` names the option in the error."""
    t = text.strip().lower()
    scale = 1.0
    if t.endswith("bit"):
        t = t[:-3]
        if t and t[-1] in _UNITS:
            scale, t = _UNITS[t[-1]], t[:-1]
    try:
        bits = float(t) * scale
    except ValueError:
        raise PsgdError(f"{flag} {text!r} is not a bandwidth; give e.g. 10gbit") from None
    if not bits > 0:
        raise PsgdError(f"{flag} must be > 0, got {text!r}")
    return bits / 8


def _sparse_sizes(spec: str) -> tuple[int, int]:
    """(D, K) of a ``linear:D-K`` / ``svm:D-K`` spec; PsgdError without the sizes."""
    from psgd.nn.sparse import SPEC_HELP
    try:
        d, k = spec.split(":")[1].split("-")
        return int(d), int(k)
    except (IndexError, ValueError):
        raise PsgdError(f"psgd plan --model {spec}: give the sizes, {SPEC_HELP}") from None


def data_shape(data: str | None) -> tuple[tuple | None, int | None]:
    """The per-sample input shape and the classes of the dense dataset at ``data``; (None,
    None) when there is no such file (or no path)."""
    import os
    if not data or not os.path.isfile(data):
        return None, None
    from psgd.data.reader import dataset_info
    try:
        info = dataset_info(data)
    except ValueError as exc:
        raise PsgdError(f"--data {data}: {exc}") from None
    return tuple(info["input_shape"]), int(info["n_classes"])


def model_of_spec(spec: str, data: str | None = None):
    """The model ``spec`` names, on the input shape and classes of ``data`` when that file
    exists (a layer-token spec needs them; a preset other than lenet follows them, as in
    ``psgd train``)."""
    from psgd.nn.model import build_model
    from psgd.nn.sparse import build_sparse_model, is_sparse_spec
    from psgd.nn.spec import expand_preset
    shape, classes = data_shape(None if is_sparse_spec(spec) else data)
    name = spec.strip().lower()
    if shape is None and not (name.startswith("mlp:") or name == "lenet" or is_sparse_spec(spec)) \
            and expand_preset(spec, None)[1] is None:
        raise PsgdError(f"--model {spec} takes its input shape from the data: pass --data FILE, "
                        f"an existing psgd dataset")
    try:
        return build_sparse_model(spec, *_sparse_sizes(spec)) if is_sparse_spec(spec) \
            else build_model(spec, input_shape=shape, n_classes=classes)
    except ValueError as exc:
        raise PsgdError(str(exc)) from None


def train_bytes(path: str) -> int:
    """Bytes of every array under ``/train`` of the HDF5 dataset at ``path`` (the workers hold
    their slices of it in memory); 0 when there is no such file."""
    import os

    import h5py
    if not os.path.isfile(path):
        return 0
    try:
        with h5py.File(path, "r") as f:
            split = f.get("train")
            arrays = [a for a in split.values() if isinstance(a, h5py.Dataset)] if split else []
            return int(sum(a.size * a.dtype.itemsize for a in arrays))
    except OSError as exc:
        raise PsgdError(f"--data {path}: not an HDF5 dataset ({exc})") from None


def network_of(args):
    """The :class:`psgd.plan.cost.Network` of ``psgd plan``'s flags (``--bandwidth``,
    ``--latency-us``, ``--shared-link``, ``--shm-bandwidth``)."""
    from psgd.plan.cost import Network
    return Network(parse_bandwidth(args.bandwidth), args.latency_us * 1e-6, args.shared_link,
                   parse_bandwidth(args.shm_bandwidth, "--shm-bandwidth"))
