"""`psgd train --plan auto|FILE`: rank 0 searches (or reads) the plan, every rank gets it by
broadcast, and its flags (protocol, servers, pipeline, grid) are set before the job starts."""
from __future__ import annotations

import argparse
import json
import sys
from types import SimpleNamespace

from psgd.errors import PsgdError, UsageError

# the flags a plan sets: giving one beside --plan is refused
CHOSEN = ("servers", "pipeline", "microbatches", "schedule", "partition", "grid", "tensor",
          "spatial", "compress")
BUDGET = {"bandwidth": "10gbit", "latency_us": 20.0, "per_node": 1, "profile": None, "mac_ns": None,
          "shm_bandwidth": "32gbit"}
PLAN_ONLY = ("profile", "shm_bandwidth")     # budget flags --grid auto does not take


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("plans (docs/guide/plan-auto.md)")
    group.add_argument("--plan", metavar="auto|FILE", default=None,
                       help="auto: run the fastest plan of `psgd plan --auto` for this job's ranks "
                            "within --memory-per-rank; FILE: a plan saved with psgd plan --auto --json")
    group.add_argument("--bandwidth", default=None, help="--plan auto and --grid auto: each node's "
                       "link (default 10gbit; --grid auto under psgd net: its --rate)")
    group.add_argument("--latency-us", type=float, default=None,
                       help="--plan auto and --grid auto: per message (default 20)")
    group.add_argument("--shm-bandwidth", default=None, help="--plan auto: copies between the "
                       "ranks of one node (default 32gbit)")
    group.add_argument("--per-node", type=int, default=None, help="--plan auto and --grid auto: "
                       "ranks per node (default 1; under psgd net, rank r is on node r mod N)")
    group.add_argument("--mac-ns", type=float, default=None, help="--grid auto: nanoseconds per "
                       "multiply-add its compute term weighs (default 0.1; psgd plan --auto's "
                       "grid rows pass the profile's)")
    group.add_argument("--profile", default=None, metavar="FILE",
                       help="--plan auto: the per-layer profile (read if it exists, else written)")


def check(args: argparse.Namespace) -> None:
    """Before MPI: refuse a budget flag without --plan auto and a flag the plan sets; keep the
    memory budget away from the pipeline's own --memory-per-rank."""
    from psgd.run.tensor_flags import auto_grid
    grid_auto = auto_grid(getattr(args, "grid", None))
    budget = [f for f in BUDGET if getattr(args, f, None) is not None and (f in PLAN_ONLY or not grid_auto)]
    if args.plan != "auto" and budget:
        where = "--plan auto" if budget[0] in PLAN_ONLY else "--plan auto and --grid auto"
        raise ValueError(f"--{budget[0].replace('_', '-')} applies to {where}")
    if getattr(args, "latency_us", None) is not None and not args.latency_us >= 0:
        raise ValueError(f"--latency-us {args.latency_us}: must be >= 0")
    if getattr(args, "mac_ns", None) is not None and not args.mac_ns > 0:
        raise ValueError(f"--mac-ns {args.mac_ns}: must be > 0")
    if getattr(args, "per_node", None) is not None and args.per_node < 1:
        raise ValueError(f"--per-node {args.per_node}: must be >= 1")
    if args.plan is None:
        return
    given = [f for f in CHOSEN if getattr(args, f, None) is not None]
    if given:
        raise ValueError(f"--{given[0]} is chosen by --plan; drop one of them")
    if args.plan == "auto" and (args.memory_per_rank is None or args.model is None):
        raise ValueError("--plan auto needs --model SPEC and --memory-per-rank BYTES")
    args.plan_memory, args.memory_per_rank = args.memory_per_rank, None


def network_flags(args: argparse.Namespace) -> SimpleNamespace:
    """The network flags --grid auto prices its cuts on (None where not given)."""
    return SimpleNamespace(**{f: getattr(args, f, None) for f in ("bandwidth", "latency_us", "per_node", "mac_ns")})


def _read(path: str, ranks: int) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
        plan = data["plans"][0] if "plans" in data else data
        keys = ("kind", "protocol", "ranks", "batch", "train_args")
        missing = [k for k in keys if k not in plan]
    except (OSError, ValueError, TypeError, KeyError, IndexError) as exc:
        raise UsageError(f"--plan {path}: not a plan of psgd plan --auto --json ({exc})") from None
    if missing:
        raise UsageError(f"--plan {path}: not a plan of psgd plan --auto --json (no {missing[0]})")
    if plan["ranks"] != ranks:
        raise UsageError(f"--plan {path} is for {plan['ranks']} ranks, the job has {ranks}")
    return plan


def _search(args: argparse.Namespace, ranks: int) -> dict:
    from psgd.plan import auto
    budget_args = argparse.Namespace(
        memory_per_rank=args.plan_memory, optimizer=args.optimizer or "sgd",
        batch_size=args.batch_size or 64, shared_link=False, data=args.data,
        **{f: getattr(args, f) if getattr(args, f) is not None else v for f, v in BUDGET.items()})
    from psgd.plan.profile import loaded
    budget = auto.budget_of(budget_args, ranks)
    prof = auto.get_profile(args.model, budget_args.profile, data=args.data)
    plans, _ = auto.search(prof, budget)
    if loaded(prof):            # after the search: an error stays one line
        print(f"psgd train: warning: {loaded(prof)}", file=sys.stderr, flush=True)
    return auto.as_dict(plans[0], args.model, args.data)


def apply(args: argparse.Namespace, plan: dict) -> None:
    """Set the flags of ``plan`` (a dict of :func:`psgd.plan.auto.as_dict`) on ``args``; an
    auto grid's network flags too."""
    words = plan["train_args"]
    parsed = dict(zip(words[::2], words[1::2]))
    args.protocol, args.batch_size = parsed["--protocol"], int(parsed["--batch-size"])
    args.servers = int(parsed["--servers"]) if "--servers" in parsed else None
    if "--pipeline" in parsed:
        args.pipeline, args.microbatches = int(parsed["--pipeline"]), int(parsed["--microbatches"])
        args.schedule, args.partition = parsed["--schedule"], parsed["--partition"]
    args.grid = parsed.get("--grid")
    args.spatial = int(parsed["--spatial"]) if "--spatial" in parsed else None
    args.tensor = int(parsed["--tensor"]) if "--tensor" in parsed else None   # a D x K x T pipeline
    args.compress = parsed.get("--compress")
    for flag, kind in (("--bandwidth", str), ("--latency-us", float), ("--per-node", int), ("--mac-ns", float)):
        if flag in parsed:      # an auto grid's network, which it cuts by
            setattr(args, flag[2:].replace("-", "_"), kind(parsed[flag]))


def _broadcast(comm, plan: dict | None) -> dict:
    """Rank 0's ``plan`` on every rank (JSON bytes by non-blocking broadcasts: rank 0 may
    still be profiling while the others wait)."""
    import numpy as np

    from psgd.mpi import wait
    text = json.dumps(plan).encode() if comm.Get_rank() == 0 else b""
    size = np.array([len(text)], np.int64)
    wait.wait(comm.Ibcast(size, root=0), "rank 0 to choose the plan")
    buf = np.frombuffer(text, np.uint8).copy() if text else np.zeros(int(size[0]), np.uint8)
    wait.wait(comm.Ibcast(buf, root=0), "rank 0 to send the plan")
    return json.loads(bytes(buf).decode())


def choose(args: argparse.Namespace, comm) -> None:
    """Rank 0 finds the plan and broadcasts it (or its error, which it prints once and every
    rank exits 1); every rank applies it."""
    plan = None
    if comm.Get_rank() == 0:
        try:
            plan = _search(args, comm.Get_size()) if args.plan == "auto" \
                else _read(args.plan, comm.Get_size())
        except (PsgdError, ValueError) as exc:
            plan = {"error": str(exc)}
    plan = _broadcast(comm, plan)
    if "error" in plan:
        if comm.Get_rank() == 0:
            print(f"psgd: error: {plan['error']}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    apply(args, plan)
    if comm.Get_rank() == 0:
        print(f"psgd train: plan {plan.get('plan', args.plan)}: predicted "
              f"{plan.get('step_s', float('nan')) * 1e3:.1f} ms per step, "
              f"{plan.get('memory_per_rank', 0) / 2**20:.1f} MB per rank; "
              f"{' '.join(plan['train_args'])}", flush=True)
