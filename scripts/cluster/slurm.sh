#!/usr/bin/env bash
# Run a Slurm client (sbatch, srun, salloc, sinfo, squeue, scancel, scontrol,
# or any command) on the head host of slurm_up.sh's cluster, the login host:
# SLURM_CONF points at the cluster's configuration and the controller's
# address (10.77.0.1) is reachable there, as it is not from the root namespace.
#
#   scripts/cluster/slurm.sh COMMAND [ARGS...]
#
# The cluster is TPR_CLUSTER_TAG's (default "tpr"). The command's status is
# returned; exit 2 if the cluster is not up.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/cluster/slurm_env.sh
. "$here/slurm_env.sh"
case "${1:-}" in ''|-h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; [ -n "${1:-}" ] || exit 2; exit 0 ;; esac
if [ ! -f "$SLURM_CONF" ] || [ ! -e "/run/netns/$head_ns" ]; then
  echo "slurm.sh: no Slurm cluster for tag '$tag' (scripts/cluster/slurm_up.sh)" >&2
  exit 2
fi
on_host 0 "$@"
