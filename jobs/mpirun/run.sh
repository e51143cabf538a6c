#!/usr/bin/env bash
# Run one protocol's example config on this workstation with mpiexec.
#   jobs/mpirun/run.sh PROTOCOL [extra psgd train flags...]
# NP (ranks, default 3: 1 server + 2 workers; allreduce uses them all as workers),
# MPIEXEC and PY may be set in the environment. Make the venv first: `make install`.
set -euo pipefail
cd "$(dirname "$0")/../.."
protocol=${1:?usage: jobs/mpirun/run.sh bsp|ssp|asp|hogwild|allreduce [flags...]}
shift
NP=${NP:-3}
PY=${PY:-.venv/bin/python}
MPIEXEC=${MPIEXEC:-.venv/bin/mpiexec}
[ -f data/synth.h5 ] || "$PY" -m psgd data synth -o data/synth.h5
exec "$MPIEXEC" -n "$NP" "$PY" -m psgd train --config "jobs/configs/$protocol.toml" "$@"
