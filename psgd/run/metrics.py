"""Metrics as JSON lines: one record per logged step, per evaluation, and a final summary."""
from __future__ import annotations

import json
import math
import os
import time
from typing import IO

import numpy as np


def _clean(value):
    """JSON-safe: numpy scalars to Python, non-finite floats to strings."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return [_clean(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsLog:
    """Append JSON records to ``path`` (or discard them when ``path`` is None).

    Every record gets ``kind`` (``step``, ``eval``, ``summary`` or ``config``)
    and ``time`` (seconds since the log was opened). With ``tensorboard`` (a
    directory) every record also goes into TensorBoard event files there.
    """

    def __init__(self, path: str | os.PathLike | None, append: bool = False,
                 tensorboard: str | os.PathLike | None = None) -> None:
        self.start = time.perf_counter()
        self._fh: IO[str] | None = None
        self._events = None
        if tensorboard is not None:
            from psgd.run.tb_events import EventWriter
            self._events = EventWriter(tensorboard)
        if path is not None:
            parent = os.path.dirname(os.fspath(path))
            if parent:
                os.makedirs(parent, exist_ok=True)
            self._fh = open(path, "a" if append else "w", encoding="utf-8")

    def write(self, kind: str, **fields) -> dict:
        record = {"kind": kind, "time": round(time.perf_counter() - self.start, 6), **fields}
        if self._fh is not None:
            self._fh.write(json.dumps(_clean(record)) + "\n")
            self._fh.flush()
        if self._events is not None:
            self._events.add(_clean(record))
        return record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self._events is not None:
            self._events.close()
            self._events = None


def read_log(path: str | os.PathLike) -> list[dict]:
    """All records of a JSON-lines log; a clear ValueError names a bad line."""
    records = []
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"log {path}: cannot open ({exc.strerror})") from None
    with fh:
        try:
            lines = fh.readlines()
        except UnicodeDecodeError:
            raise ValueError(f"log {path}: not a psgd JSON-lines log (not UTF-8 text; "
                             f"`psgd plot` reads the --log of `psgd train`)") from None
        for lineno, line in enumerate(lines, 1):
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"log {path}, line {lineno}: not JSON ({exc.msg})") from None
            if not isinstance(record, dict) or "kind" not in record:
                raise ValueError(f"log {path}, line {lineno}: not a psgd metrics record")
            records.append(record)
    return records

