#!/usr/bin/env bash
# A real single-node SLURM on this machine, for the slurm feature's tests (.ci/run starts and stops it):
#   scripts/slurm/local_cluster.sh start DIR && export SLURM_CONF=DIR/slurm.conf   # sinfo: the node idle
#   scripts/slurm/local_cluster.sh stop DIR
# Debian's slurmctld, slurmd, slurm-client and munge, run as root; state, spool and logs in DIR; ports 6917/6918.
# One node named after this host with its CPUs, one partition `debug`; jobs are tracked by their processes
# (proctrack/linuxproc, task/none): no cgroups needed.
set -euo pipefail
action=${1:?start or stop}
dir=${2:?a folder for the state, spool and logs}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf="$dir/slurm.conf"
case "$action" in
start)
  mkdir -p "$dir/state" "$dir/spool" /run/munge
  chown munge:munge /run/munge
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  if ! pgrep -x munged > /dev/null; then  # started here, stopped here
    runuser -u munge -- /usr/sbin/munged
    touch "$dir/munged.ours"
  fi
  host=$(hostname -s)
  cat > "$conf" <<CONF
ClusterName=local
SlurmctldHost=$host
SlurmctldPort=6917
SlurmdPort=6918
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
MinJobAge=300
KillWait=30
InactiveLimit=0
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  export SLURM_CONF="$conf"  # for sinfo below; the caller exports it for its own commands
  /usr/sbin/slurmctld -f "$conf"
  /usr/sbin/slurmd -f "$conf"
  for _ in $(seq 60); do
    if sinfo -h -o %T 2>/dev/null | grep -q idle; then
      echo "SLURM up: $(sinfo -h -o '%P %D %T %C') (SLURM_CONF=$conf)"
      exit 0
    fi
    sleep 1
  done
  echo "SLURM did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
  exit 1
  ;;
stop)
  pids=""
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" /run/munge/munged.pid; do
    if [ -f "$pidfile" ] && { [ "$pidfile" != /run/munge/munged.pid ] || [ -f "$dir/munged.ours" ]; }; then
      pid=$(cat "$pidfile")
      kill "$pid" 2> /dev/null && pids="$pids $pid"
    fi
  done
  for pid in $pids; do  # gone before the caller removes the folder they write in
    for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  done
  rm -f "$dir/munged.ours"
  ;;
esac
