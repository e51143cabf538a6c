#!/usr/bin/env bash
# The ring probe (tests/mpi/ring_survivors.py) under Open MPI: one ompi-server, each job its
# own mpirun pointing at it (Open MPI 4 connects separate mpiruns no other way). One of 3
# members is SIGKILLed mid-run; the other two must finish with the same sums, each clock's
# sum that of its ring (checked by the probe's own numbers: member r adds r + 1000 * clock).
#   tests/openmpi/ring_survivors.sh PYTHON     (a python whose mpi4py is built on Open MPI)
set -euo pipefail
PY=$1
PROBE="$(cd "$(dirname "$0")/.." && pwd)/mpi/ring_survivors.py"
dir=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ompi-server --report-uri "$dir/uri" --no-daemonize & server=$!
trap 'kill "$server" 2> /dev/null; wait "$server" 2> /dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do [ -s "$dir/uri" ] && break; sleep 0.1; done
job() { timeout 90 mpirun.openmpi --ompi-server "file:$dir/uri" -n 1 "$PY" "$PROBE" "$@"; }
job coord "$dir/port" 3 40 > "$dir/coord.out" 2>&1 & coord=$!
for _ in $(seq 300); do [ -f "$dir/port" ] && break; sleep 0.1; done
members=()
for k in 1 2 3; do job ring "$dir/port" 2 after 40 512 > "$dir/ring$k.out" 2>&1 & members+=($!); done
for pid in "${members[@]}"; do wait "$pid" || true; done
wait "$coord" || true
"$PY" - "$dir" <<'PYEOF'
import json, pathlib, sys
outs = [p.read_text() for p in sorted(pathlib.Path(sys.argv[1]).glob("ring*.out"))]
done = [o for o in outs if "SUMS " in o]
assert len(done) == 2, "\n---\n".join(outs)
got = {(o.split("SUMS ", 1)[1].splitlines()[0], o.split("RING ", 1)[1].splitlines()[0]) for o in done}
assert len(got) == 1, got   # both survivors agree
sums, rings = (json.loads(x) for x in got.pop())
assert rings[0] == [1, 2, 3] and rings[-1] == [1, 3], rings
assert sums == [sum(r + 1000.0 * c for r in rings[c]) for c in range(len(rings))], sums
print(f"ring probe under Open MPI: the survivors went on from clock {rings.index([1, 3])}")
PYEOF
