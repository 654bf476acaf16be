#!/usr/bin/env bash
# N "hosts" on one machine: Linux network namespaces joined by a bridge.
#
#   scripts/cluster/hosts.sh up N     create hosts 0..N-1 (idempotent; extra hosts of an earlier up are removed)
#   scripts/cluster/hosts.sh down     remove every namespace of this cluster
#   scripts/cluster/hosts.sh list     host i, its namespace and address, one a line
#   scripts/cluster/hosts.sh check    exit 0 if namespaces can be made here, else 77 with the reason
#
# Host i is namespace $TPR_CLUSTER_TAG-h<i> with eth0 = 10.77.0.<i+1>/24 and
# loopback up. Its veth peer (h<i>) sits in a switch namespace
# ($TPR_CLUSTER_TAG-sw) on bridge br0, so the root namespace is never touched
# and two clusters with different tags (TPR_CLUSTER_TAG, default "tpr") can
# reuse the same subnet side by side without seeing each other.
# Needs CAP_NET_ADMIN (root); where it is missing every command but down
# exits 77 with "skipped: cannot create network namespaces: <why>".
set -euo pipefail

tag="${TPR_CLUSTER_TAG:-tpr}"
case "$tag" in ''|*[!A-Za-z0-9_.-]*) echo "hosts.sh: TPR_CLUSTER_TAG '$tag' must be [A-Za-z0-9_.-]+" >&2; exit 2 ;; esac
sw="$tag-sw"
subnet_prefix="10.77.0"
max_hosts=200

usage() { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; }

# Skip (77), not fail, where this machine cannot make namespaces: a test
# that needs them then reports "skipped" with the reason.
skip() { echo "skipped: cannot create network namespaces: $*" >&2; exit 77; }

check() {
  command -v ip >/dev/null 2>&1 || skip "the 'ip' command (iproute2) is not installed"
  local probe="$tag-probe$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then skip "ip netns add: ${err:-failed} (needs root / CAP_NET_ADMIN)"; fi
  if ! err=$(ip -n "$probe" link add br0 type bridge 2>&1 && ip -n "$probe" link add va type veth peer name vb 2>&1); then
    ip netns del "$probe" 2>/dev/null || true
    skip "bridge/veth: ${err:-failed}"
  fi
  ip netns del "$probe"
}

ns_exists() { [ -e "/run/netns/$1" ]; }

# Namespaces of this tag, hosts sorted by index.
host_namespaces() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${tag//./\\.}-h[0-9]+$" | sort -t h -k2 -n || true; }

down() {
  local ns
  for ns in $(host_namespaces); do ip netns del "$ns" 2>/dev/null || true; done
  if ns_exists "$sw"; then ip netns del "$sw" 2>/dev/null || true; fi
  for ns in $(ip netns list 2>/dev/null | awk -v p="$tag-probe" 'index($1, p) == 1 {print $1}'); do ip netns del "$ns" 2>/dev/null || true; done
}

up() {
  local n="$1" i ns
  case "$n" in ''|*[!0-9]*) echo "hosts.sh: up needs a host count, got '$n'" >&2; exit 2 ;; esac
  if [ "$n" -lt 1 ] || [ "$n" -gt "$max_hosts" ]; then echo "hosts.sh: up N needs 1 <= N <= $max_hosts, got $n" >&2; exit 2; fi
  check
  if ! ns_exists "$sw"; then ip netns add "$sw"; fi
  ip -n "$sw" link set lo up
  ip -n "$sw" link show br0 >/dev/null 2>&1 || ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns="$tag-h$i"
    ns_exists "$ns" || ip netns add "$ns"
    ip -n "$ns" link set lo up
    if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
      ip -n "$sw" link del "h$i" 2>/dev/null || true  # a half-made pair of an interrupted up
      ip -n "$sw" link add "h$i" type veth peer name eth0 netns "$ns"
    fi
    ip -n "$sw" link set "h$i" master br0 up
    ip -n "$ns" addr replace "$subnet_prefix.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  # Hosts past N from an earlier, larger up.
  for ns in $(host_namespaces); do
    i="${ns##*-h}"
    if [ "$i" -ge "$n" ]; then ip netns del "$ns"; ip -n "$sw" link del "h$i" 2>/dev/null || true; fi
  done
  # The bridge forwards once the ports are up (no STP); wait for every link.
  local tries
  for ((i = 0; i < n; i++)); do
    for tries in $(seq 50); do
      if [ "$(ip netns exec "$tag-h$i" cat /sys/class/net/eth0/operstate)" = up ]; then break; fi
      [ "$tries" -lt 50 ] || { echo "hosts.sh: eth0 of host $i does not come up" >&2; exit 1; }
      sleep 0.1
    done
  done
  list
}

list() {
  local ns i
  for ns in $(host_namespaces); do
    i="${ns##*-h}"
    echo "host $i  netns $ns  addr $subnet_prefix.$((i + 1))"
  done
}

case "${1:-}" in
  up) up "${2:-}" ;;
  down) down ;;
  list) list ;;
  check) check ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
