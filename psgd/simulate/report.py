"""`psgd simulate`'s output: the printed summary, and the training's log, evaluations and checkpoint."""
from __future__ import annotations

import numpy as np


def _hist_line(hist: list, width: int = 12) -> str:
    total = max(sum(hist), 1)
    head = ", ".join(f"{v}: {c / total:.1%}" for v, c in enumerate(hist[:width]) if c)
    return head + (" ..." if len(hist) > width else "")


def print_summary(out: dict) -> None:
    """The summary of `psgd simulate`, a few lines."""
    st, bsp = out["staleness"], out["bsp"]
    wu = out["worker_utilisation"]
    print(f"{out['protocol']}: W={out['workers']} S={out['servers']}, {out['steps']} steps each, "
          f"{out['n_params']} parameters, compute {out['compute_ms_mean']:.3g} ms per step, "
          f"local passes at {out['shm_bandwidth'] * 8e-9:.3g} Gbit/s "
          f"(simulated in {out['simulation_wall_s']:.2f} s)")
    print(f"  {out['updates_per_s']:.1f} updates/s over {out['simulated_s']:.3g} simulated s "
          f"(bsp: {bsp['updates_per_s']:.1f}, x{out['updates_per_s'] / bsp['updates_per_s']:.2f})")
    print(f"  staleness mean {st['mean']:.2f}, p50 {st['p50']}, p99 {st['p99']}, max {st['max']}"
          f"; {_hist_line(st['histogram'])}")
    print(f"  worker utilisation mean {wu['mean']:.0%} (min {wu['min']:.0%}, max {wu['max']:.0%})"
          f", servers {', '.join(f'{u:.0%}' for u in out['server_utilisation'][:8])}, links "
          f"{out['link_utilisation']:.0%}")
    if "training" in out:
        tr = out["training"]
        print(f"  trained along it: test accuracy {tr['test_acc']:.4f}, {tr['samples']} samples "
              f"in {tr['seconds']:.1f} s, worker copies {tr['worker_copies_bytes'] / 2**20:.1f} MiB")


def train_and_log(job, schedule, workers: int, train=None) -> dict:
    """Train along ``schedule`` (``train(on_eval, eval_every)``: another trainer, as gossip's);
    log evaluations (with the simulated time) and the summary."""
    from functools import partial
    from psgd.run.metrics import MetricsLog
    from psgd.simulate.train import train_along
    s, model = job.settings, job.model
    x_test, y_test = _test_set(s)
    log = MetricsLog(s.log, tensorboard=s.traces.tensorboard)
    log.write("config", **s.as_dict(), workers=workers, simulated=True)
    per_clock = workers * (job.shard_map.n_shards if job.shard_map is not None else 1)
    train = train or partial(train_along, job, schedule.order, workers)

    def evaluate(index, pushes, params, samples):
        model.params[:] = params
        loss, acc = model.evaluate(x_test, y_test)
        log.write("eval", step=pushes // per_clock, samples=samples,
                  simulated_s=float(schedule.times[index]), test_loss=loss, test_acc=acc)

    result = train(evaluate, s.eval_every * per_clock)
    model.params[:] = result["params"]
    loss, acc = model.evaluate(x_test, y_test)
    out = {"test_loss": float(loss), "test_acc": float(acc), "samples": result["samples"],
           "seconds": result["seconds"], "worker_copies_bytes": result["worker_copies_bytes"]}
    log.write("summary", **out, simulated_s=schedule.seconds)
    log.close()
    if s.checkpoint_dir:
        job.save_checkpoint(job.total_steps, result["params"], {})
    return out


def _test_set(s) -> tuple[np.ndarray, np.ndarray]:
    from psgd.data.reader import ShardReader
    x, y = ShardReader(s.data, 0, 1, s.batch_size, seed=s.seed).test_set()
    if s.eval_samples:
        x, y = x[:s.eval_samples], y[:s.eval_samples]
    return x, y
