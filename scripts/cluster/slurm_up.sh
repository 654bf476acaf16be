#!/usr/bin/env bash
# A Slurm cluster of namespace hosts (hosts.sh): slurmctld and munged on
# host 0 (the head, also the login host), one slurmd on each of hosts 1..N.
#
#   scripts/cluster/slurm_up.sh [--nodes N] [--cpus C]
#
# Defaults: 2 nodes of 4 CPUs each (declared; the nodes share this machine's
# cores, so Slurm is told to trust the configuration, not the hardware).
# Installs munge, slurmctld, slurmd and slurm-client with apt where missing.
# Idempotent: a running cluster of the same size is left as it is (dead
# daemons restarted); another size is taken down and made again. Returns
# once `sinfo` shows every node idle, printing the nodes and SLURM_CONF.
# Clients run on the head host: scripts/cluster/slurm.sh sbatch|srun|sinfo...
# (it sets SLURM_CONF); the root namespace has no route to the bridge.
# Configuration without systemd and cgroups: proctrack/linuxproc, task/none.
# Per-tag directory: TPR_SLURM_DIR (default /tmp/tpr-slurm-$TPR_CLUSTER_TAG).
# Exit 77 (skipped) where namespaces cannot be made or Slurm cannot be installed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/cluster/slurm_env.sh
. "$here/slurm_env.sh"

nodes=2
cpus=4
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="${2:-}"; shift 2 ;;
    --cpus) cpus="${2:-}"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "slurm_up.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
for v in nodes cpus; do
  case "${!v}" in ''|*[!0-9]*|0) echo "slurm_up.sh: --$v needs a positive integer, got '${!v}'" >&2; exit 2 ;; esac
done
[ "$nodes" -le 100 ] || { echo "slurm_up.sh: --nodes $nodes: at most 100" >&2; exit 2; }

# Packages: the daemons, the clients, munge; libpmix for srun --mpi=pmix.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null ||
   ! command -v munged >/dev/null; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "skipped: Slurm (slurmctld, slurmd, slurm-client, munge) is not installed and cannot be installed here" >&2; exit 77
  fi
  echo "slurm_up.sh: installing slurmctld slurmd slurm-client munge libpmix-bin" >&2
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      slurmctld slurmd slurm-client munge libpmix-bin >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      slurmctld slurmd slurm-client munge libpmix-bin >/dev/null; }; } ||
    { echo "skipped: apt-get could not install Slurm" >&2; exit 77; }
fi

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# Another size: start again from nothing.
if [ -f "$sdir/nodes.count" ] && [ "$(cat "$sdir/nodes.count")" != "$nodes:$cpus" ]; then
  "$here/slurm_down.sh"
fi

"$here/hosts.sh" up $((nodes + 1)) >/dev/null

mkdir -p "$sdir"/{munge,ctld,log,tmp,nodes}
chmod 755 "$sdir/munge"  # munged wants its socket reachable by all; the key itself is 0400
echo "$nodes:$cpus" >"$sdir/nodes.count"

# munge: a key of this cluster's own and a socket in its directory (every
# namespace host sees the same file system, as nodes see a shared one).
if [ ! -s "$sdir/munge/munge.key" ]; then
  dd if=/dev/urandom of="$sdir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$sdir/munge/munge.key"
fi
if ! alive "$sdir/munge/munged.pid"; then
  rm -f "$sdir/munge/munge.socket"*
  ip netns exec "$head_ns" munged --force --socket="$sdir/munge/munge.socket" --key-file="$sdir/munge/munge.key" \
    --pid-file="$sdir/munge/munged.pid" --log-file="$sdir/log/munged.log" --seed-file="$sdir/munge/munged.seed"
fi

cluster="$(echo "$tag" | tr -c 'a-zA-Z0-9\n' x | tr 'A-Z' 'a-z')"
conf_new="$sdir/slurm.conf.new"
cat >"$conf_new" <<EOF
# Made by scripts/cluster/slurm_up.sh for tag $tag: $nodes nodes on namespace hosts.
ClusterName=$cluster
SlurmctldHost=$head_ns($head_addr)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: also how long a requeued job waits before it may start again
# (Slurm's default 120 s); 10 s is ample for nodes on one machine.
AuthInfo=socket=$sdir/munge/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$sdir/ctld
SlurmdSpoolDir=$sdir/nodes/%n
SlurmctldPidFile=$sdir/slurmctld.pid
SlurmdPidFile=$sdir/nodes/%n.pid
SlurmctldLogFile=$sdir/log/slurmctld.log
SlurmdLogFile=$sdir/log/slurmd-%n.log
PlugStackConfig=$sdir/plugstack.conf
TmpFS=$sdir/tmp
MailProg=/bin/true
# No systemd, no cgroups: processes are tracked by parent pid, tasks unbound.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
# A requeued job is looked at again within seconds, not Slurm's 30.
SchedulerParameters=bf_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The nodes share this machine's cores: trust the CPUs declared below.
SlurmdParameters=config_overrides
# A dead node is noticed within seconds and comes back by itself when its
# slurmd registers again; batch jobs are requeued when a node of theirs dies.
SlurmdTimeout=10
SlurmctldTimeout=10
MessageTimeout=5
ReturnToService=2
JobRequeue=1
MinJobAge=300
InactiveLimit=0
EOF
for ((i = 1; i <= nodes; i++)); do
  echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") NodeHostname=$(node_name "$i") CPUs=$cpus State=UNKNOWN" >>"$conf_new"
done
echo "PartitionName=tpr Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >>"$conf_new"
: >"$sdir/plugstack.conf"
# slurmd 22.05 loads a cgroup plugin even when nothing uses it, and its
# autodetection fails where /sys/fs/cgroup is not a cgroup file system (a
# tmpfs of v1 hierarchies here, none in some containers); v1 loads anywhere
# and is never used with proctrack/linuxproc and task/none.
echo "CgroupPlugin=cgroup/v1" >"$sdir/cgroup.conf"
if ! cmp -s "$conf_new" "$SLURM_CONF"; then mv "$conf_new" "$SLURM_CONF"; else rm -f "$conf_new"; fi

if ! alive "$sdir/slurmctld.pid"; then
  on_host 0 slurmctld -i
fi
for ((i = 1; i <= nodes; i++)); do
  n="$(node_name "$i")"
  mkdir -p "$sdir/nodes/$n/tmp"
  # Each node's TmpFS (where slurmstepd's PMIx server puts its per-step
  # directories, named alike on every node) is the node's own, as a real
  # node's /tmp is: a mount namespace binds nodes/<n>/tmp over $sdir/tmp.
  if ! alive "$sdir/nodes/$n.pid"; then
    # A node whose slurmd died and that runs no step any more comes back as
    # from a reboot: an empty /tmp, and no socket or directory of a killed
    # step's PMIx server in the spool (all named by job and step: left
    # behind, they stop the same step of a requeued job from starting).
    ip netns pids "$n" | xargs -r ps -o comm= -p 2>/dev/null | grep -q slurmstepd ||
      { find "$sdir/nodes/$n/tmp" -mindepth 1 -delete; rm -rf "$sdir/nodes/$n"/stepd.slurm.pmix.* "$sdir/nodes/$n"/pmix.*; }
    ip netns exec "$n" unshare --uts --mount --propagation private sh -c \
      'hostname "$0" && mount --bind "$1/nodes/$0/tmp" "$1/tmp" && exec slurmd -N "$0"' "$n" "$sdir"
  fi
done

# Wait until every node is idle (registration takes a few seconds).
state=""
for tries in $(seq 120); do
  state="$(on_host 0 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)"
  idle="$(echo "$state" | awk '$2 == "idle"' | wc -l)"
  [ "$idle" -lt "$nodes" ] || break
  if [ "$tries" = 120 ]; then
    echo "slurm_up.sh: nodes not idle after 60 s:" >&2; echo "$state" >&2
    tail -n 5 "$sdir"/log/*.log >&2 || true
    exit 1
  fi
  # A node that was DOWN before (a killed slurmd) is back once it registers
  # (ReturnToService=2); one drained by hand is resumed here.
  echo "$state" | awk '$2 ~ /drain|down/ {print $1}' | while read -r n; do
    on_host 0 scontrol update NodeName="$n" State=RESUME 2>/dev/null || true
  done
  sleep 0.5
done
echo "slurm cluster '$tag': $nodes nodes idle; SLURM_CONF=$SLURM_CONF"
echo "$state" | sed 's/^/  /'
echo "clients: $here/slurm.sh sinfo | sbatch ... | srun ...   (run on the head host $head_ns, $head_addr)"
