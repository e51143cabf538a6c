#!/usr/bin/env bash
# Run one protocol's example config on this workstation with mpiexec.
#   jobs/mpirun/run.sh PROTOCOL [extra psgd train flags...]
# NP (ranks, default 3: 1 server + 2 workers; allreduce uses them all as workers),
# MPIEXEC and PY may be set in the environment. MPIEXEC is the launcher with any options
# (MPIEXEC="mpirun --oversubscribe"); default the venv's mpiexec (the PyPI MPICH), else the
# mpiexec on PATH (after `make install MPI=system`). Make the venv first: `make install`.
# The config's log and checkpoint folder belong to the first run: run again with --resume
# runs/PROTOCOL-ckpt to continue it (with more --steps), or with --overwrite to start afresh.
set -euo pipefail
cd "$(dirname "$0")/../.."
protocol=${1:?usage: jobs/mpirun/run.sh bsp|ssp|asp|hogwild|allreduce|gossip|adpsgd [flags...]}
shift
NP=${NP:-3}
PY=${PY:-.venv/bin/python}
if [ -z "${MPIEXEC:-}" ]; then
    MPIEXEC=mpiexec
    [ -x .venv/bin/mpiexec ] && MPIEXEC=.venv/bin/mpiexec
fi
read -ra launcher <<< "$MPIEXEC"
command -v "${launcher[0]}" > /dev/null || { echo "$0: no launcher ${launcher[0]} (set MPIEXEC)" >&2; exit 2; }
[ -f data/synth.h5 ] || { mkdir -p data && "$PY" -m psgd data synth -o data/synth.h5; }
exec "${launcher[@]}" -n "$NP" "$PY" -m psgd train --config "jobs/configs/$protocol.toml" "$@"
