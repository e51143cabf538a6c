#!/usr/bin/env bash
# allreduce on a workstation (see run.sh for NP, MPIEXEC, PY).
exec "$(dirname "$0")/run.sh" allreduce "$@"
