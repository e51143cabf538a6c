"""Parameter-server checks under mpiexec: bsp equals serial SGD, ssp staleness bounds, overlap, bad pushes, server CPU.

Usage: ps_check.py MODE [options] [--then MODE [options] ...]; rank 0 prints one
``RESULT {json}`` line per scenario, in order (several scenarios share one launch).
The gradient is linear softmax regression on fixed random data (numpy only).
"""
import argparse
import dataclasses
import json
import math
import sys
import time

import numpy as np
from mpi4py import MPI
from reference import softmax_grad

from psgd.protocols.features import CompensationOptions
from psgd.errors import report_and_abort
from psgd.mpi.roles import assign_roles
from psgd.mpi.shardmap import ShardMap
from psgd.nn.optim import make_optimizer
from psgd.protocols import get
from psgd.protocols.features import make_config
from psgd.ps.messages import HEADER_LEN, PUSH, PUSH_WINDOW, TAG_CTRL, TAG_PUSH
from psgd.ps.server import serve
from psgd.ps.worker import PSWorker

D, K, B, N_BATCHES = 12, 4, 8, 5
N_PARAMS = K * D + K
LR = 0.3
USE_WINDOW = [True]   # off for a scenario given --messages



def ps_config(protocol, n, staleness=None, **kw):
    """make_config, passing the bound only to a protocol that takes one (ssp)."""
    if get(protocol).bound is not None:
        staleness = None
    return make_config(protocol, n, staleness=staleness, push_window=USE_WINDOW[0], **kw)

def data(n_workers):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((N_BATCHES, n_workers, B, D))
    y = rng.integers(0, K, size=(N_BATCHES, n_workers, B))
    return x, y


def initial_params():
    return (np.random.default_rng(7).standard_normal(N_PARAMS) * 0.1).astype(np.float32)


def serial_reference(n_workers, steps, optimizer, opt_hparams):
    """Single-process SGD on the concatenated batches; params and opt state after every clock."""
    x, y = data(n_workers)
    params = initial_params()
    opt = make_optimizer(optimizer, N_PARAMS, **opt_hparams)
    trail = []
    for c in range(steps):
        b = c % N_BATCHES
        grad = softmax_grad(params, x[b].reshape(-1, D), y[b].ravel(), K)
        opt.step(params, grad, LR)
        trail.append((params.copy(), {k: np.copy(v) for k, v in opt.state_dict().items()}))
    return trail


def run_ps(args, roles, config, step_hook=None, grad_fn=None):
    smap = ShardMap(config.n_params, roles.n_servers)
    out = {"server": None, "worker": None, "snapshots": []}
    if roles.is_server:
        init = smap.view(initial_params(), roles.server_index)

        def on_snapshot(clock, params, opt_state):
            out["snapshots"].append((clock, params.copy(),
                                     {k: np.copy(v) for k, v in opt_state.items()}))

        out["server"] = serve(roles, smap, config, init_shard=init, on_snapshot=on_snapshot,
                              start_clock=args.start_clock)
    else:
        x, y = data(roles.n_workers)
        w = roles.worker_index
        worker = PSWorker(roles, smap, dataclasses.replace(config, overlap=args.overlap))
        if step_hook is not None:
            step_hook.worker = worker   # a hook may read the worker's state
        params = np.zeros(config.n_params, np.float32)
        worker.start(params, args.start_clock)
        for c in range(args.steps):
            if step_hook:
                step_hook(roles, c)
            b = c % N_BATCHES
            grad = softmax_grad(params, x[b, w], y[b, w], K)
            if worker.grad_buffer is not None:   # as psgd train computes it: in the window
                worker.grad_buffer[:] = grad
                grad = worker.grad_buffer
            worker.step(params, grad, args.start_clock + c)
        worker.finish()
        out["worker"] = {"params": params, "stats": dict(worker.stats)}
    return out


def mode_bsp(args, comm):
    roles = assign_roles(comm, args.servers)
    hp = {"momentum": 0.9} if args.optimizer == "momentum" else {}
    config = ps_config("bsp", N_PARAMS, optimizer=args.optimizer, opt_hparams=hp,
                            lr_schedule=lambda c: LR, snapshot_every=args.snapshot_every)
    out = run_ps(args, roles, config)
    pulled = comm.gather(out["worker"]["params"] if roles.is_worker else None, root=0)
    hists = comm.gather(out["server"].staleness_hist.tolist() if roles.is_server else None, root=0)
    held = comm.gather(out["server"].buffer_bytes if roles.is_server else None, root=0)
    via = comm.gather((out["server"].n_window_pushes, out["server"].n_pushes)
                      if roles.is_server else None, root=0)
    if comm.Get_rank() != 0:
        return
    res = out["server"]
    k = len(make_optimizer(args.optimizer, 1, **hp).state_keys)
    smap = ShardMap(N_PARAMS, roles.n_servers)
    want_bytes = [4 * smap.size(s) * (5 + k) for s in range(roles.n_servers)]
    assert held[:roles.n_servers] == want_bytes, (held, want_bytes)
    trail = serial_reference(roles.n_workers, args.steps, args.optimizer, hp)
    want, want_state = trail[-1]
    tol = dict(rtol=1e-5, atol=1e-6)
    err = float(np.abs(res.params - want).max())
    assert np.allclose(res.params, want, **tol), f"bsp differs from serial SGD: max err {err}"
    for key in want_state:
        if key == "steps":
            continue
        assert np.allclose(res.opt_state[key], want_state[key], **tol), f"opt state {key} differs"
    for i, p in enumerate(pulled):
        if p is not None:
            assert np.array_equal(p, res.params), f"rank {i} last pulled other params than final"
    assert all(h == [args.steps * roles.n_workers] for h in hists if h is not None), hists
    clocks = [c for c, _, _ in out["snapshots"]]
    if args.snapshot_every:
        first = args.start_clock
        expect = [c for c in range(first, first + args.steps) if (c + 1) % args.snapshot_every == 0]
        assert clocks == expect, f"snapshot clocks {clocks}, expected {expect}"
        for c, p, st in out["snapshots"]:
            ref_params, ref_state = trail[c - first]
            assert np.allclose(p, ref_params, **tol), f"snapshot {c} params differ"
            for key in ref_state:
                if key != "steps":
                    assert np.allclose(st[key], ref_state[key], **tol), f"snapshot {c} {key}"
    print("RESULT " + json.dumps({"max_err": err, "n_updates": res.n_updates,
                                  "in_place": res.n_in_place, "version_waits": res.n_version_waits,
                                  "snapshots": clocks, "buffer_bytes": want_bytes,
                                  "window_pushes": [v for v in via if v is not None]}),
          flush=True)


def mode_stale(args, comm):
    roles = assign_roles(comm, args.servers)
    s = math.inf if args.protocol == "asp" else args.staleness
    config = ps_config(args.protocol, N_PARAMS, staleness=s, lr_schedule=lambda c: 0.05)
    slow = roles.n_workers - 1

    def hook(roles, c):
        if roles.worker_index == slow:
            time.sleep(args.sleep)

    out = run_ps(args, roles, config, step_hook=hook)
    info = None
    if roles.is_server:
        info = {"max": out["server"].max_staleness, "hist": out["server"].staleness_hist.tolist(),
                "buffer_bytes": out["server"].buffer_bytes}
    winfo = out["worker"]["stats"]["max_staleness"] if roles.is_worker else None
    infos, winfos = comm.gather(info, root=0), comm.gather(winfo, root=0)
    if comm.Get_rank() != 0:
        return
    server_max = [i["max"] for i in infos if i is not None]
    worker_max = max(w for w in winfos if w is not None)
    assert worker_max == max(server_max), (worker_max, server_max)
    if args.protocol != "asp":
        assert max(server_max) <= s, f"staleness {server_max} exceeds the bound {s}"
    print("RESULT " + json.dumps({"server_max": server_max, "worker_max": worker_max,
                                  "hists": [i["hist"] for i in infos if i],
                                  "buffer_bytes": [i["buffer_bytes"] for i in infos if i]}),
          flush=True)


def mode_adaptive(args, comm):
    """--staleness auto: the last worker is slow for the first half; every reply within its bound.

    Every worker sleeps ``--base-sleep`` a step, so that a step is more than the
    machine's jitter and even workers have even step times.
    """
    roles = assign_roles(comm, args.servers)
    config = make_config("ssp", N_PARAMS, staleness="auto", staleness_max=args.staleness_max,
                         overlap=args.overlap, lr_schedule=lambda c: 0.05,
                         push_window=USE_WINDOW[0])
    slow, half = roles.n_workers - 1, args.steps // 2
    checked = []

    def hook(roles, c):   # before clock c: the parameters held are those pulled for clock c
        if c > 0:
            worker = hook.worker
            assert (worker.read_versions >= c - worker.read_bounds).all(), \
                f"clock {c}: versions {worker.read_versions} under bounds {worker.read_bounds}"
            checked.append(float(worker.read_bounds.min()))
        time.sleep(args.base_sleep + (args.sleep if roles.worker_index == slow and c < half
                                      else 0.0))

    out = run_ps(args, roles, config, step_hook=hook)
    history = out["server"].bound_history if roles.is_server else None
    histories, seen = comm.gather(history, root=0), comm.gather(checked, root=0)
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps({"histories": [h for h in histories if h is not None],
                                      "checked": sum(len(c) for c in seen if c)}), flush=True)


def mode_overlap(args, comm):
    """One worker, asp, overlap: exactly SGD with a delay of one clock (deterministic).

    The pull for clock c + 1 is posted before the push of clock c, and a
    server handles one worker's messages in the order sent, so the gradient of
    clock c >= 1 is computed on the parameters after updates 0..c-2.
    """
    roles = assign_roles(comm, args.servers)
    assert roles.n_workers == 1
    config = ps_config("asp", N_PARAMS, lr_schedule=lambda c: LR)
    out = run_ps(args, roles, config)
    hists = comm.gather(out["server"].staleness_hist.tolist() if roles.is_server else None, root=0)
    if comm.Get_rank() != 0:
        return
    x, y = data(1)
    theta = [initial_params()]
    opt = make_optimizer("sgd", N_PARAMS)
    for c in range(args.steps):
        b = c % N_BATCHES
        grad = softmax_grad(theta[max(c - 1, 0)], x[b, 0], y[b, 0], K)
        nxt = theta[-1].copy()
        opt.step(nxt, grad, LR)
        theta.append(nxt)
    err = float(np.abs(out["server"].params - theta[-1]).max())
    assert np.allclose(out["server"].params, theta[-1], rtol=1e-5, atol=1e-6), err
    want = [1, args.steps - 1]
    assert all(h == want for h in hists if h is not None), (hists, want)
    print("RESULT " + json.dumps({"max_err": err, "hists": [h for h in hists if h]}), flush=True)


def mode_bad(args, comm):
    roles = assign_roles(comm, args.servers)
    config = ps_config(args.protocol, N_PARAMS, staleness=1)
    smap = ShardMap(N_PARAMS, roles.n_servers)
    if roles.is_server:
        serve(roles, smap, config)
        raise AssertionError("server returned after a bad push")
    # worker 0 makes the push window with the others; with window-empty it offers no
    # segment there (an overlapping worker pushes by messages), yet claims a push in it
    PSWorker(roles, smap, dataclasses.replace(config, overlap=args.bad == "window-empty")).start(
        np.zeros(N_PARAMS, np.float32))
    if roles.worker_index != 0:
        time.sleep(60)
        return
    in_window = args.bad.startswith("window")
    target = roles.n_servers - 1
    header = np.array([PUSH_WINDOW if in_window else PUSH, 0, 0, target], np.int64)
    payload = np.ones(smap.size(target), np.float32)
    if args.bad == "length":
        payload = np.ones(smap.size(target) + 3, np.float32)
    elif args.bad in ("shard", "window-shard"):
        header[3] = 0 if target != 0 else 1
    elif args.bad == "nonfinite":
        payload[1] = np.nan
    assert HEADER_LEN == header.shape[0]
    comm.Send(header, target, TAG_CTRL)
    if not in_window:
        comm.Send(payload, target, TAG_PUSH)
    time.sleep(60)  # the server's abort ends this rank


def mode_cpu(args, comm):
    roles = assign_roles(comm, args.servers)
    config = ps_config(args.protocol, N_PARAMS, staleness=1)

    def hook(roles, c):
        time.sleep(args.sleep)

    out = run_ps(args, roles, config, step_hook=hook)
    info = None
    if roles.is_server:
        r = out["server"]
        info = {"cpu_s": r.cpu_s, "wall_s": r.wall_s, "fraction": r.cpu_s / r.wall_s}
    infos = comm.gather(info, root=0)
    if comm.Get_rank() == 0:
        print("RESULT " + json.dumps([i for i in infos if i]), flush=True)


def mode_momentum(args, comm):
    """asp with momentum correction and amom: each worker's velocity takes, shard by shard, the
    momentum its server's last reply named (a float64 numpy reference), which falls below the
    target once pushes are late and stays within what the servers had in force."""
    roles = assign_roles(comm, args.servers)
    mu = 0.9
    config = ps_config("asp", N_PARAMS, optimizer="momentum", compensation=CompensationOptions("amom"),
                       opt_hparams={"momentum": 0.0, "weight_decay": 0.0},
                       lr_schedule=lambda c: LR,
                       worker_momentum={"momentum": mu, "nesterov": False, "weight_decay": 0.0})
    smap = ShardMap(N_PARAMS, roles.n_servers)
    found = None
    if roles.is_server:
        comp = serve(roles, smap, config, init_shard=smap.view(initial_params(),
                                                                roles.server_index)).compensation
        found = comp["momentum in force"]
    else:
        x, y = data(roles.n_workers)
        w = roles.worker_index
        worker = PSWorker(roles, smap, config)
        params = np.zeros(N_PARAMS, np.float32)
        worker.start(params)
        ref, used, err = np.zeros(N_PARAMS), [], 0.0
        for c in range(args.steps):
            grad = softmax_grad(params, x[c % N_BATCHES, w], y[c % N_BATCHES, w], K)
            mus = worker.read_momenta.copy()
            for s in range(roles.n_servers):
                part = slice(*smap.range(s))
                ref[part] = mus[s] * ref[part] + grad[part]
            worker.step(params, grad, c)
            err = max(err, float(np.abs(worker.momentum.velocity - ref).max()
                                 / max(1.0, np.abs(ref).max())))
            used.append(mus.tolist())
        worker.finish()
        found = {"err": err, "used": used}
    found = comm.gather(found, root=0)
    if comm.Get_rank() != 0:
        return
    servers, workers = found[:roles.n_servers], found[roles.n_servers:]
    err = max(r["err"] for r in workers)
    assert err < 1e-5, f"a worker's velocity is off the reference by {err}"
    used = np.array([u for r in workers for u in r["used"]])   # (pushes, S)
    for s, summary in enumerate(servers):
        low = summary["min"]
        assert np.all((used[:, s] == mu) | (used[:, s] >= low - 1e-12) & (
            used[:, s] <= summary["max"] + 1e-12)), (s, summary, used[:, s])
    assert used.min() < mu - 1e-3, f"no push took a momentum below {mu}: {used.min()}"
    print("RESULT " + json.dumps({"err": err, "lowest": float(used.min()),
                                  "servers": servers}), flush=True)


def mode_no_room(args, comm):
    """Rank 1 asks the push window for more than any address space holds (/dev/shm is
    sparse, so less may map): the job must end."""
    from psgd.ps.push_window import PushWindow
    PushWindow(comm, 10 ** 14 if comm.Get_rank() == 1 else 0)
    time.sleep(60)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["bsp", "stale", "adaptive", "overlap", "bad", "cpu",
                                     "no-room", "momentum"])
    ap.add_argument("--staleness-max", type=int, default=6)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--snapshot-every", type=int, default=0)
    ap.add_argument("--start-clock", type=int, default=0)
    ap.add_argument("--protocol", default="ssp")
    ap.add_argument("--staleness", type=float, default=1)
    ap.add_argument("--sleep", type=float, default=0.02)
    ap.add_argument("--base-sleep", type=float, default=0.0)
    ap.add_argument("--bad", default="length")
    ap.add_argument("--overlap", action="store_true")
    ap.add_argument("--messages", action="store_true", help="no push window: pushes by messages")
    comm = MPI.COMM_WORLD
    modes = {"bsp": mode_bsp, "stale": mode_stale, "adaptive": mode_adaptive, "overlap": mode_overlap, "bad": mode_bad,
             "cpu": mode_cpu, "no-room": mode_no_room, "momentum": mode_momentum}
    argv, scenarios = sys.argv[1:], [[]]
    for word in argv:
        if word == "--then":
            scenarios.append([])
        else:
            scenarios[-1].append(word)
    for scenario in scenarios:
        args = ap.parse_args(scenario)
        USE_WINDOW[0] = not args.messages
        modes[args.mode](args, comm)
        comm.Barrier()


if __name__ == "__main__":
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - any failure must end every rank
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        report_and_abort(exc)
