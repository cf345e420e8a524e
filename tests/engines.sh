#!/usr/bin/env bash
# The remote engines the executor tests run against (tests/test_executors_remote.py): a local Ray
# head (Job Submission REST API at http://127.0.0.1:8265) and a one-node Slurm cluster.
#
#   tests/engines.sh install   Ray 2.60.0 in a venv under ~/.cache/goaltender; Slurm + munge via apt (root)
#   tests/engines.sh start     both up (installs what is missing); idempotent
#   tests/engines.sh stop      both down
#   tests/engines.sh status    what is up
#
# Recipes and their gotchas: /work/shared/research/executors-verified.md (token auth is turned off
# explicitly; a job's PATH is the `ray start` environment; a failed `ray start` leaves daemons).
# Addresses are written to ~/.cache/goaltender/engines.env (GOALTENDER_TEST_RAY=...).
# The Ray head declares 2 GPUs it does not have, so a job asking for one is placed and sees the one
# Ray gave it (CUDA_VISIBLE_DEVICES), as on a GPU node. Slurm does not: a gres/gpu declared by count
# alone (gres.conf, no device files) left slurmd 22.05 reporting 0 GPUs and the node INVAL.
set -euo pipefail

RAY_VERSION=2.60.0
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/goaltender"
RAY_VENV="$CACHE/ray-$RAY_VERSION"
RAY_ADDRESS_URL=http://127.0.0.1:8265
ENV_FILE="$CACHE/engines.env"
SLURM_CONF=/etc/slurm/slurm.conf

log() { echo "engines: $*" >&2; }

# --- Ray -------------------------------------------------------------------------------------

ray_install() {
  if [ -x "$RAY_VENV/bin/ray" ] && "$RAY_VENV/bin/python" -c "import ray, aiohttp_cors; assert ray.__version__ == '$RAY_VERSION'" 2>/dev/null; then
    return
  fi
  local py
  py=$(command -v python3.11 || command -v python3)
  log "installing ray[default]==$RAY_VERSION into $RAY_VENV ($py)"
  mkdir -p "$CACHE"
  "$py" -m venv "$RAY_VENV"
  "$RAY_VENV/bin/python" -m pip install --quiet --upgrade pip
  "$RAY_VENV/bin/python" -m pip install --quiet "ray[default]==$RAY_VERSION"
}

ray_up() { curl -sf -m 2 "$RAY_ADDRESS_URL/api/version" >/dev/null 2>&1; }

ray_start() {
  if ray_up; then
    log "ray: already up at $RAY_ADDRESS_URL"
    return
  fi
  ray_install
  log "ray: starting the head"
  # Jobs inherit this environment: the venv's bin first, so `python` in an entrypoint is Ray's.
  if ! (cd / && PATH="$RAY_VENV/bin:$PATH" RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled \
    "$RAY_VENV/bin/ray" start --head --node-ip-address 127.0.0.1 --port 6379 \
    --num-cpus 2 --num-gpus 2 --dashboard-host 127.0.0.1 --dashboard-port 8265 \
    --object-store-memory 200000000 --disable-usage-stats >/dev/null); then
    log "ray: start failed; stopping what it left running"
    "$RAY_VENV/bin/ray" stop >/dev/null 2>&1 || true
    return 1
  fi
  for _ in $(seq 120); do ray_up && return; sleep 0.5; done
  log "ray: the dashboard never answered at $RAY_ADDRESS_URL/api/version"
  "$RAY_VENV/bin/ray" stop >/dev/null 2>&1 || true
  return 1
}

ray_stop() {
  if [ -x "$RAY_VENV/bin/ray" ]; then
    "$RAY_VENV/bin/ray" stop >/dev/null 2>&1 || true
  fi
}

# --- Slurm -----------------------------------------------------------------------------------

slurm_install() {
  if command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ]; then
    return
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    log "slurm: missing; run as root on Debian/Ubuntu: apt-get install slurmctld slurmd slurm-client munge"
    return 1
  fi
  log "slurm: installing slurmctld slurmd slurm-client munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

slurm_up() {
  local host
  host=$(hostname -s)
  [ -f "$SLURM_CONF" ] && scontrol ping >/dev/null 2>&1 &&
    [[ "$(sinfo -h -n "$host" -o %t 2>/dev/null)" =~ ^(idle|mix|alloc)$ ]]
}

slurm_write_conf() {
  local host cpus
  host=$(hostname -s)
  cpus=$(nproc)
  cat >"$SLURM_CONF" <<CONF
ClusterName=ci
SlurmctldHost=$host
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
MailProg=/bin/true
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=/var/log/slurm/jobcomp.log
ReturnToService=2
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
}

alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pidfile() { cat "$1" 2>/dev/null || true; }

slurm_start() {
  if slurm_up; then
    log "slurm: already up (cluster ci, node $(hostname -s))"
    return
  fi
  slurm_install
  if [ "$(id -u)" != 0 ]; then
    log "slurm: starting the daemons needs root"
    return 1
  fi
  log "slurm: starting munged, slurmctld, slurmd"
  [ -s /etc/munge/munge.key ] || mungekey --create
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  alive "$(pidfile /run/munge/munged.pid)" || runuser -u munge -- /usr/sbin/munged
  munge -n | unmunge >/dev/null
  install -d -o slurm -g slurm /var/lib/slurm/slurmctld /var/log/slurm
  install -d /var/lib/slurm/slurmd
  # Ours (cluster "ci") is written anew, so a box set up by an older version of this script gets
  # today's; a cluster configured by anyone else is left as it is.
  if [ ! -f "$SLURM_CONF" ] || grep -qx "ClusterName=ci" "$SLURM_CONF"; then slurm_write_conf; fi
  touch /var/log/slurm/jobcomp.log && chmod 0666 /var/log/slurm/jobcomp.log # sacct -c for non-root
  scontrol ping >/dev/null 2>&1 || /usr/sbin/slurmctld
  alive "$(pidfile /run/slurmd.pid)" || /usr/sbin/slurmd
  local host
  host=$(hostname -s)
  for _ in $(seq 120); do slurm_up && return; sleep 0.5; done
  log "slurm: node $host never became idle (see /var/log/slurm/slurmctld.log, slurmd.log)"
  return 1
}

slurm_stop() {
  command -v scontrol >/dev/null || return 0
  local pids
  pids="$(pidfile /run/slurmctld.pid) $(pidfile /run/slurmd.pid)"
  if scontrol ping >/dev/null 2>&1; then
    scancel --state=PENDING,RUNNING --full 2>/dev/null || true
    for _ in $(seq 40); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.25; done # leave COMPLETING
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  for _ in $(seq 60); do
    local any=
    for p in $pids; do alive "$p" && any=1; done
    [ -z "$any" ] && break
    sleep 0.25
  done
  local munged
  munged=$(pidfile /run/munge/munged.pid)
  if alive "$munged"; then kill "$munged"; fi
}

# --- commands --------------------------------------------------------------------------------

write_env() {
  mkdir -p "$CACHE"
  {
    ray_up && echo "GOALTENDER_TEST_RAY=$RAY_ADDRESS_URL"
    slurm_up && echo "GOALTENDER_TEST_SLURM=ci"
    true
  } >"$ENV_FILE"
  cat "$ENV_FILE"
}

status() {
  if ray_up; then echo "ray: up at $RAY_ADDRESS_URL"; else echo "ray: down"; fi
  if slurm_up; then echo "slurm: up (node $(hostname -s) $(sinfo -h -n "$(hostname -s)" -o %t))"; else echo "slurm: down"; fi
}

case "${1:-}" in
  install) ray_install && slurm_install ;;
  start)
    rc=0
    ray_start || rc=1
    slurm_start || rc=1
    write_env
    exit $rc
    ;;
  stop)
    ray_stop
    slurm_stop
    rm -f "$ENV_FILE"
    ;;
  status) status ;;
  *)
    echo "usage: $0 install|start|stop|status" >&2
    exit 2
    ;;
esac
