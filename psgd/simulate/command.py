"""`psgd simulate`: predict a protocol's throughput and staleness at W workers, and train along it."""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace

import numpy as np

from psgd.errors import PsgdError

DESCRIPTION = """\
Simulate W workers and S servers under bsp, ssp, asp or hogwild (or W workers
under gossip or adpsgd), one event at a time: compute times drawn from a measured distribution, pushes and pulls on the
links of psgd plan's cost model. Prints the predicted updates/s, the staleness
distribution and utilisation beside bsp's at the same W. With --data and
--train it also trains the model in the simulated order (the real update rule
and staleness compensation); --record writes the order in psgd train --record's
format, which psgd train --replay runs to the same parameters, bit for bit.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`psgd train`'s flags (the run the simulation stands for) and the simulator's own."""
    from psgd.run.settings import add_arguments as train_arguments
    train_arguments(parser)
    sim = parser.add_argument_group("simulation")
    sim.add_argument("--workers", type=int, required=True, help="simulated workers W")
    src = sim.add_mutually_exclusive_group()
    src.add_argument("--compute-ms", type=float, help="each step's compute, milliseconds")
    src.add_argument("--compute-from", metavar="FILE", help="draw step times from a real run's "
                     "--timeline trace or --log (default: profile --model here)")
    sim.add_argument("--jitter", help="heavy-tailed factor on each step's compute: "
                     "lognormal:SIGMA or pareto:ALPHA")
    sim.add_argument("--bandwidth", default="10gbit", help="each node's link (default 10gbit)")
    lat = sim.add_mutually_exclusive_group()
    lat.add_argument("--latency-us", type=float, default=20.0, help="per message (default 20)")
    lat.add_argument("--latency-from", metavar="FILE", help="draw each message's latency from a "
                     "real run's --timeline (half of each pull's round trip; gossip: the "
                     "exchange, the mean step span)")
    sim.add_argument("--shm-bandwidth", default="measure", help="copies and passes within a "
                     "node, e.g. 32gbit (default: measured here, an optimizer step on a vector "
                     "of the model's size being 4 passes)")
    sim.add_argument("--per-node", type=int, default=1, help="ranks per node (default 1)")
    sim.add_argument("--shared-link", action="store_true", help="all nodes share one link")
    sim.add_argument("--cores", type=int, help="the cores all ranks share (default one per "
                     "rank): a compute or a server's work stretches while more ranks run; give "
                     "compute times a rank takes alone (--compute-ms, the profile)")
    sim.add_argument("--busy-wait", action="store_true", help="with --cores: a waiting rank is "
                     "runnable too (MPICH's own blocking calls spin; psgd's waits sleep)")
    sim.add_argument("--poll", action="store_true", help="a message is seen at the receiver's "
                     "next poll: psgd's waits poll, then sleep 20 us growing to "
                     "PSGD_X_POLL_MAX_SLEEP (a poll's and a sleep's cost measured here); not with "
                     "--latency-from, whose pulls hold these waits already")
    sim.add_argument("--train", action="store_true", help="train along the simulated order "
                     "(needs --data)")
    sim.add_argument("--json", metavar="FILE", help="write the summary as JSON")


def _settings(args):
    """The run's settings: resolved and validated as `psgd train`'s with --data, else as given."""
    from psgd.run.run_plan import FLAG_NAMES, RunPlan
    from psgd.run.settings import resolve
    if args.data is not None:
        return resolve(args)
    if args.train or args.record:
        raise PsgdError("--train and --record need --data (the run they stand for)")
    given = {name: getattr(args, name) for name in FLAG_NAMES
             if getattr(args, name, None) is not None}
    return RunPlan.from_flat({"servers": 1, **given})


def _samples(args, settings) -> list:
    from psgd.simulate.compute import samples_from_file
    if args.compute_ms is not None:
        if not args.compute_ms > 0:
            raise PsgdError(f"--compute-ms must be > 0, got {args.compute_ms}")
        return [np.array([args.compute_ms * 1e-3])]
    if args.compute_from:
        return samples_from_file(args.compute_from)
    from psgd.plan.command import measure_compute_s
    return [np.array([measure_compute_s(settings.model, settings.batch_size, seconds=1.0)
                      * settings.batch_size])]


def _check(args, settings, protocol) -> None:
    if args.workers < 1:
        raise PsgdError(f"--workers must be >= 1, got {args.workers}")
    if settings.servers < 1 and not protocol.decentralized:
        raise PsgdError(f"--servers must be >= 1 for {protocol.name}, got {settings.servers}")
    if settings.recording.record and protocol.decentralized:
        raise PsgdError(f"--record writes a server's order, which {protocol.name} has not")
    if settings.recording.record and not protocol.can("replay"):
        raise PsgdError(f"--record writes a server's order, which {protocol.name} "
                        f"has not{protocol.why_not('replay')}")
    if args.cores is not None and args.cores < 1:
        raise PsgdError(f"--cores must be >= 1, got {args.cores}")
    if args.cores is not None and protocol.decentralized:
        raise PsgdError(f"--cores models the parameter-server protocols' ranks, not "
                        f"{protocol.name}'s")
    if args.poll and (args.cores is not None or args.latency_from or protocol.decentralized):
        raise PsgdError("--poll models the parameter-server protocols' waits on a core per rank, "
                        "with the network's latency: drop --cores and --latency-from")
    if args.busy_wait and args.cores is None:
        raise PsgdError("--busy-wait needs --cores (the cores the waiting ranks spin on)")
    if settings.overlap:
        raise PsgdError("psgd simulate posts each pull behind its push: a pull posted before "
                        "the compute (--overlap) is not modelled; drop --overlap")


def _check_job(job) -> None:
    """What the virtual workers cannot run: velocities instead of gradients."""
    if job.config.worker_momentum:
        raise PsgdError("psgd simulate --train pushes each virtual worker's gradient, not the "
                        "velocity the workers keep under --momentum-correction (on, or auto "
                        "with error feedback); pass --momentum-correction off, or drop --train")


def _network(args, n_params: int, mean_s: float, settings, workers: int, span: str):
    """The cost model's job and network, and the measured latencies (None: the network's;
    ``span``: which spans of --latency-from hold them, see
    :func:`psgd.simulate.compute.latencies_from_file`; "step": a gossip step's exchange,
    no message latency)."""
    from psgd.plan.command import parse_bandwidth
    from psgd.plan.cost import Job, Network, check
    from psgd.simulate.compute import latencies_from_file
    if args.per_node < 1:
        raise PsgdError(f"--per-node must be >= 1, got {args.per_node}")
    from psgd.plan.command import measure_compression
    latencies = latencies_from_file(args.latency_from, span) if args.latency_from else None
    latency = (float(np.median(latencies)) if latencies is not None and span == "pull"
               else args.latency_us * 1e-6)
    coding = measure_compression(settings.compression.compress,
                                 settings.compression.compress_bucket, n_params)
    job = Job(n_params, mean_s / settings.batch_size, settings.batch_size,
              workers, settings.servers, args.per_node, compression=coding)
    net = Network(parse_bandwidth(args.bandwidth), latency, args.shared_link,
                  _shm_bandwidth(args.shm_bandwidth, n_params, settings.optimizer))
    check(job, net)
    return job, net, latencies


def _shm_bandwidth(text: str, n_params: int, optimizer: str | None) -> float:
    """``--shm-bandwidth`` in bytes/s: as given, or ``measure``: the run's optimizer (sgd when
    none is set) stepping a vector of ``n_params`` here, a step being STEP_PASSES passes."""
    from psgd.plan.command import parse_bandwidth
    from psgd.simulate.links import measure_shm_bandwidth
    if text == "measure":
        return measure_shm_bandwidth(n_params, optimizer or "sgd")
    return parse_bandwidth(text)


def _simulate(protocol, staleness, pjob, net, times, latencies=None, seed=0, cpu=None,
              polls=None):
    """The event loop's schedule and wall seconds (``cpu``: None, or the straggler waits in
    ``times`` and ``(cores, busy_wait)``; ``polls``: see :mod:`psgd.simulate.polls`)."""
    from psgd.simulate.events import simulate
    from psgd.simulate.links import Links
    from psgd.simulate.rules import rules_for
    rules = rules_for(protocol, staleness, pjob, net)
    waits, cores = cpu if cpu is not None else (None, None)
    t0 = time.perf_counter()
    schedule = simulate(rules, times, pjob.servers, Links(pjob, net, latencies, seed),
                        waits, cores, polls)
    return schedule, time.perf_counter() - t0


def run(args: argparse.Namespace) -> None:
    from psgd.protocols import get
    from psgd.simulate.compute import compute_times, straggler_waits
    from psgd.simulate.stats import summary
    try:
        settings = _settings(args)
        protocol = get(settings.protocol)
        _check(args, settings, protocol)
        job = None
        if settings.data is not None:
            from psgd.simulate.train import build_job
            job = build_job(settings, args.workers)
            if args.train:
                _check_job(job)
        n_params = job.model.n_params if job else _n_params(settings.model)
        steps = job.total_steps if job else settings.steps or 100
        samples = _samples(args, settings)
        times = compute_times(samples, args.workers, steps, settings.seed, args.jitter)
        waits = straggler_waits(times, settings.seed, settings.stragglers.straggler)
        times += waits
        graph = _graph(protocol, settings, args.workers)
        span = "step" if isinstance(graph, np.ndarray) else "pull"
        pjob, net, lat = _network(args, n_params, float(times.mean()), settings, args.workers,
                                  span)
        times += pjob.compression.encode_s * pjob.nbytes   # a coded push is encoded first
        cpu = None if args.cores is None else (waits, (args.cores, args.busy_wait))
        polls = _polls(args)
        if protocol.decentralized:
            found, schedule, wall, train = _gossip(graph, settings, job, pjob, (net, lat), times)
            pjob, lat = replace(pjob, servers=1), (lat if span == "pull" else None)
        else:
            schedule, wall = _simulate(protocol, settings.staleness, pjob, net, times, lat,
                                       settings.seed, cpu, polls)
            found, train = summary(schedule), None
        bsp, _ = _simulate(get("bsp"), None, pjob, net, times, lat, settings.seed, cpu, polls)
    except ValueError as exc:
        raise PsgdError(str(exc)) from None
    out = {"protocol": protocol.label(protocol.staleness_bound(settings.staleness)),
           "workers": args.workers, "servers": settings.servers, "steps": steps,
           "n_params": n_params, "compute_ms_mean": float(times.mean() * 1e3),
           "shm_bandwidth": net.shm_bandwidth, "cores": args.cores,
           "polls": None if polls is None else asdict(polls),
           "simulation_wall_s": wall, **found,
           "bsp": {k: v for k, v in summary(bsp).items() if k != "delay"}}
    if settings.recording.record:
        _record(settings, schedule, args.workers, steps)
        out["record"] = settings.recording.record
    if args.train:
        from psgd.simulate.report import train_and_log
        out["training"] = train_and_log(job, schedule, args.workers, train)
    from psgd.simulate.report import print_summary
    print_summary(out)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)


def _polls(args):
    """--poll: the waits' poll times measured here (None: a message is seen on landing)."""
    if not args.poll:
        return None
    from psgd.simulate.polls import measure
    return measure()


def _graph(protocol, settings, workers: int):
    """A decentralized protocol's graph (:func:`psgd.simulate.gossip.graph`); None for the
    parameter servers'."""
    if not protocol.decentralized:
        return None
    from psgd.simulate import gossip
    return gossip.graph(protocol, protocol.topology(settings.topology, workers), workers)


def _gossip(matrix, settings, job, pjob, network, times):
    """A decentralized protocol's summary, its clocks, the loop's seconds and its trainer
    (``network``: the network and any measured latencies: AD-PSGD's links draw them, gossip
    takes its exchange from them)."""
    from functools import partial
    from psgd.simulate import gossip
    W, (net, measured) = times.shape[0], network
    if not isinstance(matrix, np.ndarray):   # partners: pairs without a global step
        return _pairs(matrix, settings, job, pjob, network, times)
    plain = replace(pjob, servers=0)
    exchange_s, mix_s = gossip.costs(matrix, plain, net)
    nodes = [plain.node(w) for w in range(W)]   # the links': TCP moves models under the compute
    if measured is not None:   # a real run's wait after its compute, wherever its ranks were
        exchange_s, nodes = gossip.measured_exchange(measured, mix_s), None
    t0 = time.perf_counter()
    ends = gossip.step_ends(times, matrix, exchange_s, mix_s, nodes)
    wall = time.perf_counter() - t0
    train = partial(gossip.train_mixing, job, matrix, W) if job is not None else None
    return gossip.summary(ends, times, exchange_s), gossip.Clocks(ends), wall, train


def _pairs(partners, settings, job, pjob, network, times):
    """AD-PSGD's summary, its pair schedule, the loop's seconds and its trainer."""
    from functools import partial
    from psgd.run.worker_rank import averages_at
    from psgd.simulate import adpsgd
    from psgd.simulate.links import Links
    W, T = times.shape
    plain, (net, latencies) = replace(pjob, servers=0), network
    meets = [k for k in range(1, T + 1) if averages_at(settings, k, T)]
    t0 = time.perf_counter()
    links = Links(plain, net, latencies, settings.seed)
    schedule = adpsgd.simulate_pairs(times, partners, settings.seed, links,
                                     adpsgd.costs(plain, net), meets)
    wall = time.perf_counter() - t0
    train = partial(adpsgd.train_pairs, job, schedule.order, W) if job is not None else None
    return adpsgd.summary(schedule, times), schedule, wall, train


def _n_params(spec: str) -> int:
    from psgd.plan.command import model_of_spec
    return model_of_spec(spec).n_params


def _record(settings, schedule, workers: int, steps: int) -> None:
    from psgd.run.record import write_events
    order = schedule.order
    shards = [order[order[:, 0] == s, 1:] for s in range(settings.servers)]
    write_events(settings, shards, workers, 0, steps, "simulated")
