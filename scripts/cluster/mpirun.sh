#!/usr/bin/env bash
# mpirun across the namespace "hosts" of hosts.sh: Open MPI's TCP BTL between
# hosts, over the veth pairs and the bridge, shared memory only inside one.
#
#   scripts/cluster/mpirun.sh [--hosts N] [--ranks-per-host R] [--dry-run] -- CMD [ARGS...]
#
# Defaults: 2 hosts, 1 rank per host. Ranks are placed by slot (ranks
# 0..R-1 on host 0, R..2R-1 on host 1, ...), as `mpirun -np N*R` places them
# on one machine. mpirun itself runs inside host 0's namespace and starts one
# orted per other host through scripts/cluster/netns_rsh.sh (Open MPI's rsh
# agent, in place of ssh), so every byte between hosts crosses a veth pair.
# If the hosts are not up (TPR_CLUSTER_TAG, default "tpr"), they are brought
# up for this run and taken down when it ends, whatever way it ends.
# Exit 77 (skipped) where network namespaces cannot be made; otherwise
# mpirun's status. --dry-run prints the mpirun command line.
# Extra mpirun arguments: TPR_CLUSTER_MPIRUN_ARGS (split on spaces).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

hosts=2
rph=1
dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts="${2:-}"; shift 2 ;;
    --ranks-per-host) rph="${2:-}"; shift 2 ;;
    --dry-run) dry=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "mpirun.sh: unknown option '$1' (the command goes after --)" >&2; exit 2 ;;
  esac
done
for v in hosts rph; do
  case "${!v}" in ''|*[!0-9]*|0) echo "mpirun.sh: --${v/rph/ranks-per-host} needs a positive integer, got '${!v}'" >&2; exit 2 ;; esac
done
[ $# -ge 1 ] || { echo "mpirun.sh: no command (usage: mpirun.sh [--hosts N] [--ranks-per-host R] -- CMD...)" >&2; exit 2; }
command -v mpirun >/dev/null 2>&1 || { echo "skipped: mpirun (Open MPI) is not installed" >&2; exit 77; }

export TPR_CLUSTER_TAG="${TPR_CLUSTER_TAG:-tpr}"
tag="$TPR_CLUSTER_TAG"

# Open MPI 4 calls its shared-memory BTL vader; 5 calls it sm (vader an alias).
if ompi_info --parsable 2>/dev/null | grep -q '^mca:btl:vader:'; then shm=vader; else shm=sm; fi

host_list=""
for ((i = 0; i < hosts; i++)); do host_list+="${host_list:+,}10.77.0.$((i + 1)):$rph"; done

# Open MPI refuses root without these; ranks on other hosts get them (and
# the paths that find orted, tpr and their libraries) through -x, as they
# would through ssh on a real cluster.
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export_args=()
for v in $(compgen -e | grep -E '^(OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)?|PATH|LD_LIBRARY_PATH|TPR_.*|ASAN_OPTIONS|LSAN_OPTIONS|UBSAN_OPTIONS|OMP_NUM_THREADS)$' | sort); do
  export_args+=(-x "$v")
done

# Every host shares this machine's cores: binding would pin rank 0 of each
# host to the same core.
mpi=(mpirun --host "$host_list" --bind-to none
     --mca plm_rsh_agent "$here/netns_rsh.sh"
     --mca pml ob1 --mca btl "tcp,self,$shm"
     --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24
     "${export_args[@]}")
# shellcheck disable=SC2206
[ -z "${TPR_CLUSTER_MPIRUN_ARGS:-}" ] || mpi+=($TPR_CLUSTER_MPIRUN_ARGS)
mpi+=("$@")

if [ "$dry" = 1 ]; then printf '%q ' ip netns exec "$tag-h0" "${mpi[@]}"; echo; exit 0; fi

up_here=0
have=$("$here/hosts.sh" list | wc -l)
if [ "$have" -lt "$hosts" ]; then
  trap '"$here/hosts.sh" down' EXIT
  trap 'exit 130' INT TERM
  up_here=1
  "$here/hosts.sh" up "$hosts" >/dev/null
fi

# mpirun in host 0's namespace (and hostname), so it addresses every host,
# itself included, over the bridge.
rc=0
ip netns exec "$tag-h0" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$tag-h0" "${mpi[@]}" || rc=$?
[ "$up_here" = 0 ] || "$here/hosts.sh" down
trap - EXIT
exit "$rc"
