#!/usr/bin/env bash
# adpsgd on a workstation (NP ranks, all workers) (see run.sh for NP, MPIEXEC, PY).
exec "$(dirname "$0")/run.sh" adpsgd "$@"
