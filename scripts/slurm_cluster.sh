#!/usr/bin/env bash
# A real single-node Slurm cluster (munge + slurmctld + slurmd from Debian packages) for tests.
#   bash scripts/slurm_cluster.sh start    install if missing, configure, start, wait until idle
#   bash scripts/slurm_cluster.sh stop     stop the daemons this script started
#   bash scripts/slurm_cluster.sh status   sinfo
# Idempotent: `start` on a running cluster only checks it. Needs root (or sudo) to install and
# to run slurmd. No cgroups: proctrack/linuxproc, task/none (works inside containers).
set -euo pipefail

CMD=${1:-start}
HOST=$(hostname -s)
CONF_DIR=/etc/slurm
CONF=$CONF_DIR/slurm.conf
RUN=/run/scaling_rl_slurm
STATE=/var/spool/slurmctld
SPOOL=/var/spool/slurmd
LOG=/var/log/slurm
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

log() { echo "slurm_cluster: $*" >&2; }

pid_running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
    return
  fi
  log "installing slurm-wlm and munge"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y slurm-wlm munge >/dev/null 2>&1 || {
    $SUDO apt-get update >/dev/null
    $SUDO apt-get install -y slurm-wlm munge >/dev/null
  }
}

write_conf() {
  local cpus mem
  # Declare at least 4 CPUs so a few tiny trials can share this small box (config_overrides
  # keeps slurmd from draining the node for having fewer real cores).
  cpus=$(nproc); [ "$cpus" -lt 4 ] && cpus=4
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
  $SUDO mkdir -p "$CONF_DIR" "$STATE" "$SPOOL" "$LOG" "$RUN"
  local tmp
  tmp=$(mktemp)
  cat >"$tmp" <<EOF
# written by scaling_rl scripts/slurm_cluster.sh: single node, no cgroups, no accounting
ClusterName=scalingrl
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
StateSaveLocation=$STATE
SlurmdSpoolDir=$SPOOL
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
Waittime=0
NodeName=$HOST CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  if ! cmp -s "$tmp" "$CONF"; then
    $SUDO cp "$tmp" "$CONF"
    $SUDO chmod 644 "$CONF"
    CONF_CHANGED=1
  fi
  rm -f "$tmp"
}

start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    $SUDO mkdir -p /etc/munge
    $SUDO dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  $SUDO chown munge:munge /etc/munge /etc/munge/munge.key 2>/dev/null || true
  $SUDO chmod 700 /etc/munge
  $SUDO chmod 400 /etc/munge/munge.key
  $SUDO mkdir -p /run/munge /var/lib/munge /var/log/munge
  $SUDO chown munge:munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  log "starting munged"
  if id munge >/dev/null 2>&1; then
    $SUDO runuser -u munge -- /usr/sbin/munged
  else
    $SUDO /usr/sbin/munged --force
  fi
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.2; done
  log "munged did not come up"; exit 1
}

node_state() { sinfo -h -N -n "$HOST" -o %t 2>/dev/null | head -1 | tr -d '*~#%$@ '; }

start() {
  CONF_CHANGED=0
  install
  write_conf
  start_munge
  if ! pid_running "$RUN/slurmctld.pid"; then
    log "starting slurmctld"
    $SUDO /usr/sbin/slurmctld -c   # -c: clean start, no stale jobs from an earlier life
  elif [ "$CONF_CHANGED" = 1 ]; then
    $SUDO scontrol reconfigure || true
  fi
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
  if ! pid_running "$RUN/slurmd.pid"; then
    log "starting slurmd"
    $SUDO /usr/sbin/slurmd
  fi
  local state=""
  for i in $(seq 120); do
    state=$(node_state)
    case "$state" in
      idle|mix|alloc) log "node $HOST is $state"; sinfo; return 0 ;;
      down|drain|drng|fail|inval) $SUDO scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.5
  done
  log "node $HOST did not become idle (state '$state'); see $LOG/slurmctld.log and $LOG/slurmd.log"
  sinfo || true
  exit 1
}

stop() {
  for name in slurmd slurmctld; do
    if pid_running "$RUN/$name.pid"; then
      log "stopping $name"
      $SUDO kill "$(cat "$RUN/$name.pid")" || true
    fi
  done
  if [ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null; then
    log "stopping munged"
    $SUDO kill "$(cat /run/munge/munged.pid)" || true
  fi
}

case "$CMD" in
  start) start ;;
  stop) stop ;;
  status) sinfo ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
