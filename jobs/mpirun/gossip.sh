#!/usr/bin/env bash
# gossip on a workstation (NP ranks, all workers) (see run.sh for NP, MPIEXEC, PY).
exec "$(dirname "$0")/run.sh" gossip "$@"
