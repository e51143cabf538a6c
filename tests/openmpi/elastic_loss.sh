#!/usr/bin/env bash
# A probe, not a pass/fail check: elastic asp under Open MPI 4.1.4 (docs/design/elastic.md,
# "Open MPI"). One ompi-server; a server job and 2 joiner jobs, each its own mpirun
# --ompi-server; joiner 0's whole mpirun SIGKILLed at 30 % of the updates (NOKILL=1: not),
# a third joiner started at 50 %. Prints each job's exit status and psgd lines.
#   tests/openmpi/elastic_loss.sh PYTHON   (a python whose mpi4py is built on Open MPI;
#   UPD: the run's updates, default 6000; D: the folder for its files, default a new temp one)
set -u
cd "$(dirname "$0")/../.."
PY=$1
UPD=${UPD:-6000}
D=${D:-$(mktemp -d)}; mkdir -p $D
export PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PSGD_STALL_ABORT=120
$PY -m psgd data synth -o $D/synth.h5 --train 2000 --test 500 > /dev/null
ompi-server --report-uri $D/uri --no-daemonize & oserver=$!
for _ in $(seq 100); do [ -s $D/uri ] && break; sleep 0.1; done
pids=()
shm0=$(ls /dev/shm | sort)
job() { local name=$1; shift; ( setsid timeout 200 mpirun.openmpi --ompi-server file:$D/uri -n 1 $PY -m psgd "$@" > $D/$name.out 2>&1; echo $? > $D/$name.rc ) & pids+=($!); }
job server train --elastic --protocol asp --data $D/synth.h5 --model mlp:784-64-10 --optimizer sgd --lr 0.05 --steps $UPD --port-file $D/port --stall-timeout 3 --no-worker-timeout 20 --log $D/log.jsonl --log-every 50 ${EXTRA:-}
for _ in $(seq 300); do [ -f $D/port ] && break; sleep 0.1; done
echo "port: $(ls $D/port 2>&1)"
job joiner0 join --port-file $D/port --model mlp:784-64-10; sleep 0.3; job joiner1 join --port-file $D/port
j0=$(pgrep -f "timeout 200 mpirun.openmpi .*port --model mlp" | head -1)
t0=$(date +%s)
while :; do
  u=$(grep '"step"' $D/log.jsonl 2>/dev/null | tail -1 | sed 's/.*"updates": \([0-9]*\).*/\1/')
  [ -n "$u" ] && [ "$u" -ge $((UPD * 3 / 10)) ] && break
  [ $(( $(date +%s) - t0 )) -gt 120 ] && { echo "no progress in 120 s (updates: ${u:-none})"; break; }
  sleep 0.1
done
echo "killing joiner0 (pgid $j0) at updates ${u:-?}: $(date -u +%T)"
${NOKILL:+true} kill -KILL -- -$j0
while :; do
  u=$(grep '"step"' $D/log.jsonl 2>/dev/null | tail -1 | sed 's/.*"updates": \([0-9]*\).*/\1/')
  [ -n "$u" ] && [ "$u" -ge $((UPD / 2)) ] && break
  [ -f $D/server.rc ] && break; sleep 0.1
done
echo "joiner2 at updates $u"; job joiner2 join --port-file $D/port
wait "${pids[@]}"; for f in server joiner0 joiner1 joiner2; do echo "$f exit $(cat $D/$f.rc)"; done
kill $oserver; wait $oserver 2>/dev/null; ls -d /tmp/ompi.vm.0/* 2>/dev/null
for f in server joiner0 joiner1 joiner2; do echo "== $f"; grep -E "^psgd|peer|Local|improperly" $D/$f.out; done
echo "== /dev/shm new:"; comm -13 <(echo "$shm0") <(ls /dev/shm | sort)
