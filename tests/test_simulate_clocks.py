"""The ranks' clocks in a timeline set to the server's (psgd.simulate.clocks)."""
import json

import numpy as np
import pytest

from psgd.simulate.clocks import worker_offsets
from psgd.simulate.compute import samples_from_file


def trace(zeros, starts, step_us=1000.0, delay_us=30.0, steps=8, late=()):
    """An asp run's spans: worker w (pid w+1) pushes clock c at starts[w] + c * step (true
    time), the server (pid 0) applies it delay_us later; staleness as an asp server counts
    it against the slowest worker. Each rank writes true time less its own zero."""
    pushes = sorted((starts[w] + c * step_us, w, c) for w in range(len(starts))
                    for c in range(steps))
    done, events = [0] * len(starts), []
    for t, w, c in pushes:
        stale = c - min(done)
        done[w] += 1
        args = {"clock": c, "staleness": stale}
        events.append({"ph": "X", "pid": 0, "name": "apply", "ts": t + delay_us - zeros[0],
                       "dur": 5, "args": args})
        events.append({"ph": "X", "pid": w + 1, "name": "push", "ts": t - zeros[w + 1],
                       "dur": 5, "args": args})
        events.append({"ph": "X", "pid": w + 1, "name": "step", "ts": t - 400 - zeros[w + 1],
                       "dur": 400, "args": {"clock": c}})
    return events


def test_each_workers_offset_is_its_zero_less_the_servers_plus_the_fastest_delivery():
    zeros = [0.0, 7_000.0, -4_000.0, 2_500.0]
    off = worker_offsets(trace(zeros, [0.0, 10_400.0, 23_700.0]))
    for w in (1, 2, 3):
        assert off[w] == pytest.approx(zeros[w] - zeros[0] + 30.0)


def test_a_late_start_is_read_on_the_servers_clock(tmp_path):
    zeros, starts = [0.0, 9_000.0, -6_000.0], [0.0, 20_000.0]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": trace(zeros, starts)}))
    first = [s[0] for s in samples_from_file(str(path))]
    # led by the median gap (600 us) plus the true late start, not the skewed one (5 ms)
    np.testing.assert_allclose(first, [600e-6, 600e-6 + 20_000e-6])


def test_a_trace_without_a_server_has_no_offsets():
    events = [e for e in trace([0.0, 5.0], [0.0]) if e["name"] != "apply"]
    assert worker_offsets(events) == {}
