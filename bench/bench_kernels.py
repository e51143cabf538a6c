"""Kernel throughput (forward + backward + SGD step) of psgd models beside PyTorch CPU, one thread each
(or ``--threads N`` each: BLAS's threads for psgd, torch.set_num_threads for PyTorch).

Writes kernels.json into runs/bench/kernels-TIME/ (``--publish``: bench/results/;
``--json PATH``: there only)."""
import os
import sys

# psgd ranks are single-core; pin BLAS before numpy loads it (--threads N: N threads each)
THREADS = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(THREADS)

import argparse  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

MODELS = {"mlp:784-256-256-10": (1, 28, 28), "lenet": (1, 28, 28), "cifar-cnn": (3, 32, 32)}

STARTUP_SCRIPT = """
import time, sys
t0 = time.perf_counter()
import numpy as np
from psgd.nn.model import build_model
from psgd.nn.optim import make_optimizer
shape = tuple(int(d) for d in sys.argv[2].split(","))
m = build_model(sys.argv[1], seed=0, input_shape=shape)
opt = make_optimizer("sgd", m.n_params)
x = np.random.default_rng(0).random((64, *shape), dtype=np.float32)
y = np.arange(64) % 10
m.loss_and_grad(x, y)
opt.step(m.params, m.grad, 0.01)
print(time.perf_counter() - t0)
"""


def psgd_stepper(spec, x, y, lr=0.01):
    from psgd.nn.model import build_model
    from psgd.nn.optim import make_optimizer
    model = build_model(spec, seed=0, input_shape=x.shape[1:])
    opt = make_optimizer("sgd", model.n_params)

    def step():
        model.loss_and_grad(x, y)
        opt.step(model.params, model.grad, lr)
    step.model = model
    return step


def model_bytes(model):
    """A worker's model memory after a step: parameters, gradient and every layer's buffers."""
    seen, total = set(), model.params.nbytes + model.grad.nbytes

    def walk(layers):
        nonlocal total
        for layer in layers:
            for buf in layer._bufs.values():
                if id(buf) not in seen:
                    seen.add(id(buf))
                    total += buf.nbytes
            walk(getattr(layer, "parts", []))
    walk(model.layers)
    return total


def torch_cifar_cnn(nn):
    """cifar-cnn (psgd.nn.spec.PRESETS) in PyTorch, training mode."""
    mods, c = [], 3
    for f, pool in ((32, False), (32, True), (64, False), (64, True), (128, True)):
        mods += [nn.Conv2d(c, f, 3, padding=1), nn.BatchNorm2d(f), nn.ReLU()]
        mods += [nn.MaxPool2d(2)] if pool else []
        c = f
    return nn.Sequential(*mods, nn.Flatten(), nn.Linear(128 * 4 * 4, 128), nn.ReLU(),
                         nn.Dropout(0.25), nn.Linear(128, 10))


def torch_stepper(spec, x, y, lr=0.01):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    torch.manual_seed(0)
    if spec == "cifar-cnn":
        net = torch_cifar_cnn(nn)
    elif spec == "lenet":
        net = nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Flatten(), nn.Linear(1568, 128), nn.ReLU(), nn.Linear(128, 10))
    else:
        sizes = [int(s) for s in spec.split(":")[1].split("-")]
        mods = [nn.Flatten()]
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            mods.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                mods.append(nn.ReLU())
        net = nn.Sequential(*mods)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(tx), ty).backward()
        opt.step()
    return step


def time_steps(step, n_steps):
    """(wall, CPU) seconds of ``n_steps`` calls; CPU is the whole process's, every thread's:
    with ``--threads N`` BLAS's and torch's other threads do part of the work (and the calling
    thread spins while it waits for them, so its own CPU time alone is about the wall clock)."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n_steps):
        step()
    return time.perf_counter() - t0, time.process_time() - c0


def throughput(steppers, batch, n_steps, repeats, warmup=3):
    """Median samples/s (by wall clock and by CPU time) of each stepper.

    Repeats are interleaved so every stepper sees the same machine load; the CPU-time
    figure is the steadier one on a shared machine.
    """
    for step in steppers.values():
        for _ in range(warmup):
            step()
    times = {name: [] for name in steppers}
    for _ in range(repeats):
        for name, step in steppers.items():
            times[name].append(time_steps(step, n_steps))
    return {name: (batch * n_steps / statistics.median(t[0] for t in ts),
                   batch * n_steps / statistics.median(t[1] for t in ts))
            for name, ts in times.items()}


def startup_seconds(spec, shape):
    """(cold, warm) seconds to import + build + first step in a fresh process, numba cache empty then warm."""
    with tempfile.TemporaryDirectory(prefix="psgd-numba-cache-") as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        out = []
        for _ in range(2):
            t0 = time.perf_counter()
            res = subprocess.run([sys.executable, "-c", STARTUP_SCRIPT, spec,
                                  ",".join(map(str, shape))], env=env,
                                 capture_output=True, text=True, check=True)
            out.append((time.perf_counter() - t0, float(res.stdout.split()[-1])))
        return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", metavar="PATH", help="write the results as JSON here (only)")
    common.add_output_arguments(ap)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.5, help="target seconds per timed repeat")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch even if importable")
    ap.add_argument("--no-startup", action="store_true", help="skip the cold/warm start-up measurement")
    ap.add_argument("--threads", type=int, default=1, help="threads for each of psgd and PyTorch")
    ap.add_argument("--models", metavar="A,B", help=f"models to run (default all: {', '.join(MODELS)})")
    args = ap.parse_args(argv)
    path = Path(args.json) if args.json else common.out_dir(args, "kernels") / "kernels.json"

    torch = None
    if not args.no_torch:
        try:
            import torch
            torch.set_num_threads(THREADS)
        except ImportError:
            print("PyTorch not importable: psgd numbers only (pip install torch to compare)")
    ap_models = args.models.split(",") if args.models else list(MODELS)

    results = {"batch": args.batch, "repeats": args.repeats, "threads": THREADS,
               "torch_version": getattr(torch, "__version__", None), "python": platform.python_version(),
               "models": {}}
    for spec in ap_models:
        rng = np.random.default_rng(0)
        x = rng.random((args.batch, *MODELS[spec]), dtype=np.float32)
        y = rng.integers(0, 10, args.batch)
        steppers = {"psgd": psgd_stepper(spec, x, y)}
        if torch is not None:
            steppers["torch"] = torch_stepper(spec, x, y)
        probe = time_steps(steppers["psgd"], 3)[0] / 3
        n_steps = max(5, int(args.seconds / max(probe, 1e-6)))
        rates = throughput(steppers, args.batch, n_steps, args.repeats)
        psgd_wall, psgd_cpu = rates["psgd"]
        torch_wall, torch_cpu = rates.get("torch", (None, None))
        rec = {"psgd_samples_per_s": psgd_wall, "torch_samples_per_s": torch_wall,
               "ratio_psgd_over_torch": psgd_wall / torch_wall if torch_wall else None,
               "psgd_samples_per_cpu_s": psgd_cpu, "torch_samples_per_cpu_s": torch_cpu,
               "ratio_psgd_over_torch_cpu": psgd_cpu / torch_cpu if torch_cpu else None,
               "steps_per_repeat": n_steps,
               "psgd_model_mb": model_bytes(steppers["psgd"].model) / 2 ** 20}
        results["models"][spec] = rec

    if not args.no_startup:
        for spec in ap_models:
            (cold_wall, cold_in), (warm_wall, warm_in) = startup_seconds(spec, MODELS[spec])
            results["models"][spec].update(startup_cold_s=cold_wall, startup_warm_s=warm_wall,
                                           startup_cold_inproc_s=cold_in, startup_warm_inproc_s=warm_in)

    print(f"\nforward + backward + SGD step, batch {args.batch}, {THREADS} thread(s), median of {args.repeats}")
    for clock, suffix in (("wall clock", ""), ("CPU time", "_cpu")):
        unit = "samples/s" if not suffix else "samples/CPU-s"
        print(f"{'model (' + clock + ')':<30}{'psgd ' + unit:>20}{'torch ' + unit:>21}{'psgd/torch':>12}")
        for spec, rec in results["models"].items():
            key = "samples_per_cpu_s" if suffix else "samples_per_s"
            t, r = rec[f"torch_{key}"], rec[f"ratio_psgd_over_torch{suffix}"]
            t_s, r_s = (f"{t:.0f}", f"{r:.2f}") if t else ("n/a", "n/a")
            print(f"{spec:<30}{rec[f'psgd_{key}']:>20.0f}{t_s:>21}{r_s:>12}")
    print("\nthreads busy (CPU seconds per wall second, all threads)")
    for spec, rec in results["models"].items():
        t = rec["torch_samples_per_s"]
        busy_t = f"{t / rec['torch_samples_per_cpu_s']:.2f}" if t else "n/a"
        print(f"{spec:<30}{'psgd':>8} {rec['psgd_samples_per_s'] / rec['psgd_samples_per_cpu_s']:.2f}"
              f"{'torch':>8} {busy_t}")
    print("\nmemory per worker (psgd model: parameters, gradient and layer buffers at this batch)")
    for spec, rec in results["models"].items():
        print(f"{spec:<30}{rec['psgd_model_mb']:>10.1f} MB")
    if not args.no_startup:
        print("\nstart-up: fresh process, import + build + first step (numba cache empty / warm)")
        print(f"{'model':<22}{'cold s':>10}{'warm s':>10}   (in-process part: cold / warm)")
        for spec, rec in results["models"].items():
            print(f"{spec:<22}{rec['startup_cold_s']:>10.2f}{rec['startup_warm_s']:>10.2f}"
                  f"   ({rec['startup_cold_inproc_s']:.2f} / {rec['startup_warm_inproc_s']:.2f})")
    common.write_json(path, results, common.NO_DATA)
    print(f"\nwrote {path}")
    return results


if __name__ == "__main__":
    main()
