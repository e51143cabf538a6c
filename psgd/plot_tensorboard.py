"""`psgd plot --tensorboard LOG... DIR`: existing JSON-lines logs as TensorBoard event files."""
from __future__ import annotations

import os
from pathlib import Path

from psgd.run.metrics import read_log
from psgd.run.tb_events import KINDS, EventWriter, check_dir


def convert(logs: list[str], outdir: str | os.PathLike) -> list[Path]:
    """Write each JSON-lines log's records as event files into ``outdir/<log stem>``."""
    check_dir(outdir, "psgd plot --tensorboard")
    runs = []
    for path in logs:   # every log is read (and refused) before anything is written
        records = read_log(path)
        if not any(r["kind"] in KINDS and "time" in r for r in records):
            raise ValueError(f"log {path}: not a psgd JSON-lines log (no config, step, eval or "
                             f"summary record; `psgd train --log` writes one)")
        runs.append((path, records))
    out = []
    for path, records in runs:
        run_dir = Path(outdir) / Path(path).stem
        # the records' times are seconds from the log's start; the file was last written
        # at the last record
        start = os.path.getmtime(path) - max(float(r.get("time", 0)) for r in records)
        writer = EventWriter(run_dir)
        for r in records:
            writer.add(r, walltime=start + float(r.get("time", 0)))
        writer.close()
        out.append(run_dir)
    return out
