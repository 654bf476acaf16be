#!/usr/bin/env bash
# Take down the Slurm cluster of slurm_up.sh (tag TPR_CLUSTER_TAG): every
# process inside its namespace hosts (slurmctld, slurmd, munged, slurmstepd
# and the jobs' tasks), the namespaces, and its files in its directory
# (TPR_SLURM_DIR, default /tmp/tpr-slurm-$TPR_CLUSTER_TAG; the directory
# too when nothing else is in it).
#
#   scripts/cluster/slurm_down.sh
#
# Safe to run when nothing is up. Exit 1 if a process outlives SIGKILL.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=scripts/cluster/slurm_env.sh
. "$here/slurm_env.sh"
case "${1:-}" in -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; '') ;; *) echo "slurm_down.sh: no arguments expected" >&2; exit 2 ;; esac

# Every process started in this tag's namespaces, found by namespace (ip
# netns pids), so nothing of the root namespace or of another tag is touched.
pids() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${tag//./\\.}-(h[0-9]+|sw)$"); do
    ip netns pids "$ns" 2>/dev/null || true
  done
}
left=""
for sig in TERM TERM KILL KILL; do
  left="$(pids | tr '\n' ' ')"
  [ -n "${left// /}" ] || break
  # shellcheck disable=SC2086
  kill -s "$sig" $left 2>/dev/null || true
  for _ in $(seq 20); do
    [ -n "$(pids)" ] || break
    sleep 0.25
  done
done
left="$(pids | tr '\n' ' ')"
if [ -n "${left// /}" ]; then echo "slurm_down.sh: processes outlive SIGKILL: $left" >&2; exit 1; fi
"$here/hosts.sh" down
# Only what slurm_up.sh made there: TPR_SLURM_DIR may name a directory that
# holds other things too.
if [ -d "$sdir" ]; then
  (cd "$sdir" && rm -rf munge ctld log tmp nodes slurm.conf slurm.conf.new cgroup.conf plugstack.conf nodes.count slurmctld.pid)
  rmdir "$sdir" 2>/dev/null || echo "slurm_down.sh: $sdir holds other files: left in place" >&2
fi
