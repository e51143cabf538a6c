#!/usr/bin/env bash
# srun one protocol's example config on the job's tasks; called by jobs/slurm/<protocol>.sbatch.
#   jobs/slurm/run.sh PROTOCOL [psgd train flags...]   (flags override the config)
# Task counts come from sbatch (--ntasks, --nodes); task 0..S-1 are servers (S: --servers).
# SRUN_MPI: srun's --mpi plugin. Default: pmi2 for MPICH (the PyPI wheel), pmix for Open MPI.
# PY: the python of the venv (default .venv/bin/python). PSGD_REQUEUE=0: no requeue on a stop.
set -uo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"
protocol=${1:?usage: jobs/slurm/run.sh bsp|ssp|asp|hogwild|allreduce|gossip|adpsgd [flags...]}
shift
PY=${PY:-.venv/bin/python}
if [ -z "${SRUN_MPI:-}" ]; then
    # MPI_Get_library_version may be called before MPI_Init: no MPI is started here
    lib=$("$PY" -c 'import mpi4py; mpi4py.rc.initialize = False
from mpi4py import MPI; print(MPI.Get_library_version())' 2>/dev/null)
    case "$lib" in
        *"Open MPI"*) SRUN_MPI=pmix ;;
        *) SRUN_MPI=pmi2 ;;
    esac
fi
dist=()
# Slurm's block distribution puts tasks 0..S-1 (the servers) on the first node
[ "${SLURM_JOB_NUM_NODES:-1}" -gt 1 ] && dist=(--distribution=cyclic)
echo "psgd: srun --mpi=$SRUN_MPI on ${SLURM_NTASKS:-?} task(s), ${SLURM_JOB_NUM_NODES:-?} node(s)"
srun --mpi="$SRUN_MPI" "${dist[@]}" "$PY" -m psgd train --config "jobs/configs/$protocol.toml" \
    --resume auto --quiet "$@"
rc=$?
# 75: stopped by a signal (time limit, preemption) after its checkpoint: run again from there
if [ "$rc" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "${PSGD_REQUEUE:-1}" = 1 ]; then
    scontrol requeue "$SLURM_JOB_ID" && echo "psgd: job $SLURM_JOB_ID requeued"
fi
exit "$rc"
