#!/usr/bin/env bash
# The link between namespace hosts: `tpr bench comm` across 2 hosts x 1 rank
# (Open MPI's TCP BTL over veth and a bridge) for all_gather, reduce_scatter
# and all_reduce, 1-64 MiB.
#
#   scripts/cluster/bench_link.sh [--tpr PATH] [--hosts N] [--min SIZE] [--max SIZE] [--iters N] [--blocks N] [--json]
#
# Each size is timed as --blocks blocks of --iters calls (default 5 x 10),
# reported as the interquartile mean of the blocks: the hosts share this
# machine's cores, so single blocks are noisy. Prints bench comm's table
# (size, time, algbw, busbw) per collective, or its JSON lines with --json,
# then the bytes host 0's eth0 sent and received.
# Brings up its own hosts (tag tprb<pid>) and takes them down on exit.
# Exit 77 where network namespaces cannot be made.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

tpr="$here/../../build/bin/tpr"
hosts=2
min=1M
max=64M
iters=10
blocks=5
json=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tpr) tpr="$2"; shift 2 ;;
    --hosts) hosts="$2"; shift 2 ;;
    --min) min="$2"; shift 2 ;;
    --max) max="$2"; shift 2 ;;
    --iters) iters="$2"; shift 2 ;;
    --blocks) blocks="$2"; shift 2 ;;
    --json) json=(--json); shift ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_link.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -x "$tpr" ] || { echo "bench_link.sh: $tpr is not built (cmake --build build --target tpr_cli, or --tpr PATH)" >&2; exit 2; }

export TPR_CLUSTER_TAG="tprb$$"
trap '"$here/hosts.sh" down' EXIT
trap 'exit 130' INT TERM
"$here/hosts.sh" up "$hosts" >/dev/null

stat() { ip netns exec "$TPR_CLUSTER_TAG-h0" cat "/sys/class/net/eth0/statistics/$1"; }
rx0=$(stat rx_bytes) tx0=$(stat tx_bytes)
for op in all_gather reduce_scatter all_reduce; do
  "$here/mpirun.sh" --hosts "$hosts" --ranks-per-host 1 -- \
    "$tpr" bench comm -o "$op" -b "$min" -e "$max" -f 2 -n "$iters" --blocks "$blocks" -w 3 "${json[@]}"
done
msg="host 0 eth0 over the run: rx $(($(stat rx_bytes) - rx0)) B, tx $(($(stat tx_bytes) - tx0)) B"
if [ ${#json[@]} -gt 0 ]; then echo "# $msg" >&2; else echo "# $msg"; fi
