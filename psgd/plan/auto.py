"""`psgd plan --auto`: profile the model (or read --profile), search the plans that fit the
budget, print the fastest with the command that runs each (or --json)."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import replace

from psgd.errors import UsageError
from psgd.plan import profile as profiles
from psgd.plan.search import Budget, Plan, search

PROFILE_BATCH = 32
# the base measured in one run varied by about 3 % between runs here: counted 5 % high, so
# that a plan's bytes stay above its ranks' peak resident sets
BASE_MARGIN = 1.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--auto`` flags of ``psgd plan`` (the network, --ranks and --per-node are plan's)."""
    group = parser.add_argument_group("--auto: search pipelines, tensor splits and protocols "
                                      "(docs/guide/plan-auto.md)")
    group.add_argument("--auto", action="store_true", help="search every way to run --model on "
                       "--ranks ranks within --memory-per-rank and print the fastest")
    group.add_argument("--memory-per-rank", type=parse_bytes, metavar="BYTES",
                       help="bytes each rank may hold (e.g. 200M, 2G)")
    group.add_argument("--profile", metavar="FILE", help="read the per-layer profile from FILE "
                       "if it exists, else measure it here and write it there")
    group.add_argument("--top", type=int, default=10, help="plans to print (default 10)")
    group.add_argument("--json", action="store_true", help="print the plans as JSON")
    group.add_argument("--data", default="data.h5", help="the dataset in the printed commands "
                       "(when it exists, the model takes its input shape and classes, as in psgd "
                       "train, and each rank's slice of its training split counts)")
    group.add_argument("--optimizer", default="sgd", help="its state counts in the memory "
                       "(sgd, momentum, nesterov, adagrad, adam; default sgd, psgd train's)")


def parse_bytes(text: str) -> int:
    """``200M``, ``2G``, ``512k`` or a plain byte count."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    scale = units.get(text[-1:].lower(), 1)
    try:
        value = float(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte count: {text!r} (e.g. 200M)") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 bytes, got {text!r}")
    return int(value)


def get_profile(spec: str, path: str | None, batch: int = PROFILE_BATCH,
                data: str | None = None) -> profiles.Profile:
    """The profile at ``path`` when that file exists (it must be ``spec``'s, on the same input
    shape), else one measured here, the rank's base memory included (and saved at ``path``
    when given); the model on ``data``'s input shape when that file exists."""
    from psgd.plan.base import measure
    from psgd.plan.inputs import model_of_spec
    model = model_of_spec(spec, data)
    if path and os.path.exists(path):
        prof = profiles.load(path)
        if prof.spec != model.spec:
            raise UsageError(f"--profile {path} is of model {prof.spec}, not --model {spec}")
        if prof.input_shape and prof.input_shape != tuple(model.input_shape):
            raise UsageError(f"--profile {path} is of inputs {'x'.join(map(str, prof.input_shape))}, "
                             f"not {'x'.join(map(str, model.input_shape))} (--data's)")
        return prof
    from psgd.plan.crowd import cores
    load = os.getloadavg()[0]
    prof = profiles.profile_model(model, batch)
    del model
    prof = replace(prof, base_bytes=int(measure() * BASE_MARGIN), load=load, cores=cores())
    if path:
        profiles.save(prof, path)
    return prof


def budget_of(args, ranks: int) -> Budget:
    from psgd.plan.inputs import network_of, train_bytes
    from psgd.plan.memory import OPTIMIZER_SLOTS
    if args.memory_per_rank is None:
        raise UsageError("--auto needs --memory-per-rank BYTES (e.g. 2G)")
    if args.optimizer not in OPTIMIZER_SLOTS:
        raise UsageError(f"--optimizer {args.optimizer}: choose one of {', '.join(OPTIMIZER_SLOTS)}")
    if args.per_node < 1 or args.batch_size < 1:
        raise UsageError("--per-node and --batch-size must be >= 1")
    net = network_of(args)
    return Budget(ranks, args.memory_per_rank, net, args.per_node, args.batch_size, args.optimizer,
                  train_bytes(args.data))


def command(plan: Plan, spec: str, data: str) -> list[str]:
    """The ``mpiexec`` line that runs ``plan`` (``psgd train`` with its flags), as words."""
    return ["mpiexec", "-n", str(plan.ranks), "psgd", "train", "--data", data, "--model", spec,
            *plan.train_args()]


def as_dict(plan: Plan, spec: str, data: str) -> dict:
    words = command(plan, spec, data)
    return {"plan": plan.label(), "kind": plan.kind, "protocol": plan.protocol,
            "ranks": plan.ranks, "replicas": plan.replicas, "servers": plan.servers,
            "stages": plan.stages, "microbatches": plan.microbatches, "schedule": plan.schedule,
            "partition": list(plan.partition), "parts": plan.parts, "axis": plan.axis, "batch": plan.batch,
            "step_s": plan.step_s, "samples_per_s": plan.samples_per_s,
            "memory_per_rank": plan.memory, "bubble": plan.bubble, "wire_bytes": plan.wire_bytes,
            "sync": plan.sync, "staleness": plan.staleness, "compress": plan.compress,
            "averaging": plan.averaging,
            **({"cut": plan.extra["cut"], "head": plan.extra["head"], "collective_s": float(plan.extra["collective_s"]),
                "compute_s": float(plan.extra["compute_s"])} if plan.kind == "grid" else {}),
            "train_args": plan.train_args(),
            "command": shlex.join(words),
            "sbatch": f"sbatch --ntasks {plan.ranks} --wrap "
                      + shlex.quote(shlex.join(["srun", "--mpi=pmi2", *words[3:]]))}


def arithmetic(plan: Plan) -> str:
    """``= serial``, or how the plan departs from it: ``async ~staleness``, gossip averaging,
    ``lossy CODEC``."""
    if plan.sync:
        return "= serial"
    words = [f"async ~{plan.staleness:g}"] if plan.staleness else []
    words += [plan.averaging] if plan.averaging else []
    words += [f"lossy {plan.compress}"] if plan.compress else []
    return " ".join(words) or "async"


def print_table(plans: list[Plan], spec: str, data: str) -> None:
    print(f"{'#':>2} {'plan':<38} {'step ms':>9} {'samples/s':>10} {'MB/rank':>8} "
          f"{'bubble':>6} {'wire MB':>8}  arithmetic")
    for i, p in enumerate(plans, 1):
        print(f"{i:>2} {p.label():<38} {p.step_s * 1e3:9.2f} {p.samples_per_s:10.0f} "
              f"{p.memory / 2**20:8.1f} {p.bubble:6.0%} {p.wire_bytes / 2**20:8.1f}  {arithmetic(p)}")
        print(f"   {shlex.join(command(p, spec, data))}")


def run_auto(args: argparse.Namespace) -> None:
    """``psgd plan --auto``."""
    if args.model is None:
        raise UsageError("--auto needs --model SPEC (a model psgd builds and profiles)")
    if args.ranks is None or args.ranks < 1:
        raise UsageError("--auto needs --ranks N >= 1")
    budget = budget_of(args, args.ranks)
    start = time.perf_counter()
    prof = get_profile(args.model, args.profile, data=args.data)
    profiled = time.perf_counter() - start
    start = time.perf_counter()
    plans, _ = search(prof, budget)
    searched = time.perf_counter() - start
    top = plans[:max(1, args.top)]
    if profiles.loaded(prof):
        print(f"psgd plan: warning: {profiles.loaded(prof)}", file=sys.stderr)
    if args.json:
        print(json.dumps({"model": args.model, "ranks": budget.ranks, "memory_per_rank": budget.memory,
                          "profile_s": profiled, "search_s": searched, "plans_kept": len(plans),
                          "plans": [as_dict(p, args.model, args.data) for p in top]}, indent=1))
        return
    print(f"{args.model}: {prof.param_bytes / 2**20:.2f} MB of parameters, "
          f"{prof.compute_at(budget.batch) / budget.batch * 1e6:.0f} us per sample at batch "
          f"{budget.batch}, {prof.base_bytes / 2**20:.0f} MB per "
          f"process before training state; {budget.ranks} ranks, "
          f"{budget.memory / 2**20:.0f} MB each, batch {budget.batch} per replica; profile "
          f"{profiled:.1f} s, search {searched:.2f} s, {len(plans)} plans fit")
    print_table(top, args.model, args.data)
