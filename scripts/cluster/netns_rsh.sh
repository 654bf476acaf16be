#!/usr/bin/env bash
# Open MPI's remote-shell agent for the namespace "hosts" of hosts.sh, in
# place of ssh (--mca plm_rsh_agent scripts/cluster/netns_rsh.sh).
#
#   netns_rsh.sh [ssh-style options] HOST COMMAND...
#
# Open MPI's rsh launcher calls its agent as `agent [args] host cmd words...`
# exactly as it would call ssh, and ssh joins the words with spaces for the
# remote shell; so does this: HOST (10.77.0.<i+1>, or the namespace name)
# picks namespace $TPR_CLUSTER_TAG-h<i>, and the words run there under
# `sh -c`, in a UTS namespace of their own named like the host so each
# "host" also has its own hostname (as ranks on real nodes would). The
# environment is inherited from the caller (mpirun or a parent orted), as
# with ssh under a shared home it would be the login shell's.
set -euo pipefail

tag="${TPR_CLUSTER_TAG:-tpr}"
# ssh's options: skip flags, and the argument of those that take one.
while [ $# -gt 0 ]; do
  case "$1" in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "netns_rsh.sh: usage: netns_rsh.sh [options] HOST COMMAND..." >&2; exit 2; }
host="$1"
shift
case "$host" in
  10.77.0.*)
    i=$((${host##*.} - 1))
    ns="$tag-h$i" ;;
  "$tag"-h[0-9]*) ns="$host" ;;
  *) echo "netns_rsh.sh: unknown host '$host' (want 10.77.0.N or $tag-hI)" >&2; exit 255 ;;
esac
[ -e "/run/netns/$ns" ] || { echo "netns_rsh.sh: host $host: namespace $ns does not exist (scripts/cluster/hosts.sh up N)" >&2; exit 255; }
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "$ns" "$*"
