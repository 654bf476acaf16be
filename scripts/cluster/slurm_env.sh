# Sourced by slurm_up.sh, slurm_down.sh and slurm.sh: where one tag's Slurm
# cluster lives. Everything of a cluster (config, munge key and socket,
# controller state, node spools, logs) is under one directory of its own,
#   $TPR_SLURM_DIR (default /tmp/tpr-slurm-$TPR_CLUSTER_TAG),
# so clusters of different tags, and a system Slurm of the root namespace,
# never share a file, a socket or a port (each daemon listens inside its own
# namespace host).
# shellcheck shell=bash
tag="${TPR_CLUSTER_TAG:-tpr}"
case "$tag" in ''|*[!A-Za-z0-9_.-]*) echo "slurm: TPR_CLUSTER_TAG '$tag' must be [A-Za-z0-9_.-]+" >&2; exit 2 ;; esac
export TPR_CLUSTER_TAG="$tag"
sdir="${TPR_SLURM_DIR:-/tmp/tpr-slurm-$tag}"
case "$sdir" in /*) ;; *) sdir="$PWD/$sdir" ;; esac
export SLURM_CONF="$sdir/slurm.conf"
# Host 0 is the head (slurmctld, munged, and the login host where sbatch,
# srun, sinfo run); hosts 1..N are the compute nodes, one slurmd each.
# shellcheck disable=SC2034  # used by the scripts that source this
head_ns="$tag-h0"
# shellcheck disable=SC2034
head_addr="10.77.0.1"
node_name() { echo "$tag-h$1"; }           # node i = 1..N
node_addr() { echo "10.77.0.$(($1 + 1))"; }
# Run a command on namespace host i under that host's hostname (Open MPI
# tells nodes apart by hostname; Slurm checks the controller's).
on_host() {
  local i="$1"
  shift
  ip netns exec "$tag-h$i" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$tag-h$i" "$@"
}
