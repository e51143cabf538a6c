#!/usr/bin/env bash
# psgd under a second MPI: Debian's Open MPI, mpi4py built against it (make install MPI=system)
# in its own venv, and a short run of every protocol under its mpirun. Installs openmpi-bin
# and libopenmpi-dev when missing (root); exits 0 with "skipped: <why>" where it cannot.
#   tests/openmpi/check.sh            (make test-openmpi; VENV: default .venv-openmpi)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${VENV:-.venv-openmpi}
skip() { echo "openmpi check skipped: $*"; exit 0; }
if ! command -v mpicc.openmpi > /dev/null || ! command -v mpirun.openmpi > /dev/null; then
    [ "$(id -u)" = 0 ] || skip "Open MPI is not installed and this is not root"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -q && apt-get install -y -q --no-install-recommends openmpi-bin libopenmpi-dev; } \
        > /dev/null || skip "apt-get could not install openmpi-bin libopenmpi-dev"
fi
MPICC=$(command -v mpicc.openmpi) make install MPI=system VENV="$VENV"
PY=$VENV/bin/python
"$PY" -c 'import mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI; v = MPI.Get_library_version(); assert "Open MPI" in v, v; print(v.splitlines()[0])'
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
"$PY" -m psgd data synth -o "$data/synth.h5" --train 1200 --test 200 > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# every registry entry's example run: protocol, ranks, servers
runs=$("$PY" -c 'from psgd.protocols import PROTOCOLS
for p in PROTOCOLS.values(): r = p.example_run(); print(p.name, r["ranks"], r["servers"])')
while read -r protocol ranks servers; do
    out=$(MPIEXEC="mpirun.openmpi" PY="$PY" NP="$ranks" jobs/mpirun/run.sh "$protocol" --data "$data/synth.h5" \
        --model mlp:784-32-10 --servers "$servers" --steps 20 --eval-every 0 --quiet \
        --log "$data/$protocol.jsonl" --checkpoint-dir "$data/$protocol" < /dev/null)
    echo "$out" | grep -E "final test accuracy 0\.[0-9]{4}" || { echo "$out"; exit 1; }
done <<< "$runs"
# a stop: mpirun forwards SIGUSR1 to every rank; the run checkpoints and exits 75
PSGD_X_STOP_EVERY=8 mpirun.openmpi -n 3 "$PY" -m psgd train --data "$data/synth.h5" --protocol bsp \
    --model mlp:784-32-10 --steps 100000 --eval-every 0 --quiet --log "$data/stop.jsonl" \
    --checkpoint-dir "$data/stop" > "$data/stop.out" 2>&1 &
launcher=$!
for _ in $(seq 300); do grep -qs '"step"' "$data/stop.jsonl" && break; sleep 0.2; done
kill -USR1 "$launcher"
rc=0; wait "$launcher" || rc=$?
grep -E "psgd: stopped by SIGUSR1 at step [0-9]+ of 100000" "$data/stop.out" && [ "$rc" = 75 ] \
    && ls "$data"/stop/ckpt-*.h5 > /dev/null || { echo "stop under Open MPI: exit $rc"; cat "$data/stop.out"; exit 1; }
# a ring over separate mpiruns goes on without a SIGKILLed member (docs/design/elastic.md)
tests/openmpi/ring_survivors.sh "$PY"
echo "openmpi check passed"
