"""A server rank's part of `psgd train`: host its shard until the workers finish, hand results to rank 0."""
from __future__ import annotations

import numpy as np

from psgd.mpi import timeline, wait
from psgd.mpi.phase import phase
from psgd.run.reports import TAG_FINAL_PARAMS, gather_reports


def _shard_state(job, shard: int) -> dict | None:
    """The resumed optimizer state cut to this server's shard."""
    if job.resume is None or job.resume.optimizer != job.settings.optimizer:
        return None
    lo, hi = job.shard_map.range(shard)
    return {key: (value[lo:hi].copy() if np.ndim(value) else value)
            for key, value in job.resume.opt_state.items()}


def run_server(job) -> None:
    """Serve this rank's shard under the job's protocol until every worker is done."""
    roles, settings, protocol = job.roles, job.settings, job.protocol
    shard = roles.server_index

    def save_snapshot(clock, params, opt_state):  # the state after step clock + 1
        job.save_checkpoint(clock + 1, params, opt_state)

    on_snapshot = save_snapshot if roles.rank == 0 and settings.checkpoint_dir else None
    with phase("serving", watch=False):   # its set-up and teardown steps are phases of their own
        result = protocol.serve(roles, job.shard_map, job.config,
                                init_shard=job.shard_map.view(job.model.params, shard).copy(),
                                init_opt_state=_shard_state(job, shard), on_snapshot=on_snapshot,
                                start_clock=job.start_step)
    with phase("agreeing where training ended"):
        job.stop.close()
        job.end_step = job.stop.share_end(job.end_step)   # where the workers stopped
    if timeline.current is not None:
        timeline.current.wall = result.wall_s
    if settings.recording.record:
        from psgd.run.record import save_events
        with phase("gathering the recorded events"):
            save_events(job, result.events)
    if roles.rank == 0:
        if settings.checkpoint_dir and protocol.can("server-snapshots"):
            job.save_checkpoint(job.end_step, result.params, result.opt_state or {})
        final_params = np.ascontiguousarray(result.params, dtype=np.float32)
        with phase("taking the final parameters"):
            wait.wait(roles.comm.Isend(final_params, dest=roles.lead_worker,
                                       tag=TAG_FINAL_PARAMS),
                      f"worker rank {roles.lead_worker} to take the final parameters")
    with phase("final gather"):
        _report(job, result)


def _report(job, result) -> None:
    """This server's end-of-run report to the lead worker."""
    roles = job.roles
    gather_reports(job, {
        "role": "server", "rank": roles.rank,
        "cpu_s": result.cpu_s, "wall_s": result.wall_s,
        "n_updates": result.n_updates, "n_skipped": result.n_skipped,
        "n_window_pushes": result.n_window_pushes,
        "n_pushes": result.n_pushes, "push_bytes": result.push_bytes,
        "staleness_histogram": result.staleness_hist.tolist(),
        "compensation": result.compensation,
        "bound_history": result.bound_history,
    })
