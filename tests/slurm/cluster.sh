#!/usr/bin/env bash
# A one-node Slurm cluster for tests, all state in one folder (root only).
#   tests/slurm/cluster.sh install         apt-get install slurm-wlm munge when missing
#   tests/slurm/cluster.sh start DIR       munged, slurmctld, slurmd; prints SLURM_CONF=DIR/slurm.conf
#                                          (ports SLURMCTLD_PORT, SLURMD_PORT: default 16817, 16818)
#   tests/slurm/cluster.sh stop DIR        stops exactly the daemons that start launched
set -euo pipefail
cmd=${1:?usage: cluster.sh install | start DIR | stop DIR}

install() {
    command -v slurmctld > /dev/null && command -v munged > /dev/null && return 0
    [ "$(id -u)" = 0 ] || { echo "not root: cannot install slurm-wlm" >&2; return 3; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q > /dev/null && apt-get install -y -q --no-install-recommends slurm-wlm munge > /dev/null
}

start() {
    local dir=$1 host cpus
    mkdir -p "$dir"/{munge,spool,state,log}
    dir=$(cd "$dir" && pwd)
    host=$(hostname -s)
    cpus=16   # more task slots than cores: the tests oversubscribe, as mpiexec does
    # cred_expire: a requeued job waits this long (default 120 s) before it may start again
    # FirstJobId: job ids unlike any earlier cluster's; MPICH names a node's shared memory after
    # JOBID.STEPID, and a segment a killed job left would stall every later job of that id
    # munge: its own key, socket and pid file in $dir (the daemon wants them private)
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 700 "$dir/munge"; chmod 400 "$dir/munge/munge.key"
    munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" \
        --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
        --seed-file="$dir/munge/seed" -f
    cat > "$dir/slurm.conf" <<CONF
ClusterName=psgdtest
FirstJobId=$(( (RANDOM << 15 | RANDOM) % 60000000 + 1000 ))
SlurmctldHost=$host
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=${SLURMCTLD_PORT:-16817}
SlurmdPort=${SLURMD_PORT:-16818}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
KillWait=10
SlurmdParameters=config_overrides
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF"
    for _ in $(seq 100); do
        sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed)' && { echo "SLURM_CONF=$SLURM_CONF"; return 0; }
        sleep 0.2
    done
    echo "the one-node cluster did not come up; logs in $dir/log" >&2
    return 1
}

stop() {
    local dir=$1 f
    for f in slurmd slurmctld munge/munged; do
        [ -f "$dir/$f.pid" ] || continue
        kill "$(cat "$dir/$f.pid")" 2> /dev/null || true
    done
    for f in slurmd slurmctld munge/munged; do
        for _ in $(seq 50); do
            [ -f "$dir/$f.pid" ] && kill -0 "$(cat "$dir/$f.pid")" 2> /dev/null || break
            sleep 0.1
        done
    done
}

case $cmd in
    install) install ;;
    start) start "${2:?start DIR}" ;;
    stop) stop "${2:?stop DIR}" ;;
    *) echo "unknown command $cmd" >&2; exit 2 ;;
esac
