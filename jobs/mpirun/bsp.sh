#!/usr/bin/env bash
# bsp on a workstation (see run.sh for NP, MPIEXEC, PY).
exec "$(dirname "$0")/run.sh" bsp "$@"
