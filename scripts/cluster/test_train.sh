#!/usr/bin/env bash
# ctest: `tpr train` across 2 namespace hosts x 2 ranks (tp 2 inside a host,
# dp 2 across hosts, Open MPI's TCP BTL over veth) against the same mesh on
# one host (mpirun -np 4): equal losses and saved parameters.
#
#   scripts/cluster/test_train.sh TPR_BINARY
#
# Checks, in order:
#   1. ranks 0,1 run in namespace <tag>-h0 and ranks 2,3 in <tag>-h1;
#   2. the link carries the bytes: an 8 MiB all_reduce across the 2 hosts
#      (7 calls) must raise each host's eth0 rx counter by >= 7 x 8 MiB, the
#      least each rank of a 2-rank all_reduce can receive;
#   3. the 2-host run's --json losses and model.safetensors equal the 1-host
#      run's (1e-6 relative), and each host's eth0 received at least half the
#      dense (non-expert) parameter bytes per step, the least a dp exchange of
#      their gradients can move;
#   4. negative control: a 1-host run with another --lr must fail both checks.
# Extra `tpr train` arguments for both runs: TPR_CLUSTER_TRAIN_ARGS (e.g.
# --fsdp). Exit 77 (skipped) where namespaces, mpirun or python3 are missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
fix="$here/../../tests/fixtures"
[ $# -ge 1 ] || { echo "usage: test_train.sh TPR_BINARY" >&2; exit 2; }
tpr="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
[ -x "$tpr" ] || { echo "test_train.sh: $1 is not an executable" >&2; exit 2; }
command -v mpirun >/dev/null 2>&1 || { echo "skipped: mpirun (Open MPI) is not installed"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "skipped: python3 is not installed (the comparisons)"; exit 77; }

# A tag of this run's own: another copy of the test (or a cluster of
# someone's) can exist at the same time; each tag's hosts are private.
export TPR_CLUSTER_TAG="tprc$$"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TPR_NUM_THREADS="${TPR_NUM_THREADS:-1}"
tmp="$(mktemp -d /tmp/tpr_cluster_XXXXXX)"
cleanup() { "$here/hosts.sh" down || true; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

rc=0
"$here/hosts.sh" up 2 >"$tmp/up.log" 2>&1 || rc=$?
if [ "$rc" = 77 ]; then cat "$tmp/up.log"; exit 77; fi
[ "$rc" = 0 ] || { cat "$tmp/up.log"; echo "FAIL: hosts.sh up 2 exited $rc"; exit 1; }
echo "hosts: $(tr '\n' ';' <"$tmp/up.log")"

fail() { echo "FAIL: $*"; exit 1; }
rx() { ip netns exec "$TPR_CLUSTER_TAG-h$1" cat /sys/class/net/eth0/statistics/rx_bytes; }
cluster() { "$here/mpirun.sh" --hosts 2 --ranks-per-host "$@"; }

# 1. where every rank runs
cluster 2 -- sh -c 'echo "$OMPI_COMM_WORLD_RANK $(ip netns identify $$) $(hostname)"' | sort -n >"$tmp/where"
echo "ranks (rank, netns, hostname):"; sed 's/^/  /' "$tmp/where"
want=$(printf '%s\n' "0 $TPR_CLUSTER_TAG-h0" "1 $TPR_CLUSTER_TAG-h0" "2 $TPR_CLUSTER_TAG-h1" "3 $TPR_CLUSTER_TAG-h1")
[ "$(cut -d' ' -f1,2 "$tmp/where")" = "$want" ] || fail "ranks are not in the expected namespaces"

# 2. bytes cross the veth link (warm-up 1 + 5 timed + 1 checked call)
size=$((8 << 20))
r0=$(rx 0) r1=$(rx 1)
cluster 1 -- "$tpr" bench comm -o all_reduce -b "$size" -e "$size" -w 1 -n 5 -c 1 >"$tmp/bench" ||
  { cat "$tmp/bench"; fail "tpr bench comm across hosts"; }
d0=$(($(rx 0) - r0)) d1=$(($(rx 1) - r1)) need=$((7 * size))
echo "all_reduce 8 MiB x 7 across hosts: eth0 rx host0 $d0 B, host1 $d1 B (>= $need)"
[ "$d0" -ge "$need" ] && [ "$d1" -ge "$need" ] || fail "the all_reduce's bytes did not cross the veth link"

# 3. training, 2 hosts x 2 ranks against 1 host x 4 ranks, same mesh
steps=3
# shellcheck disable=SC2206
extra=(${TPR_CLUSTER_TRAIN_ARGS:-})
train_args() {  # $1: lr, $2: save dir
  echo train --model "$fix/minimax_m2_tiny" --data "$fix/minimax_m2_train/tokens.npy" --data-order sequential \
    --seq-len 16 --steps "$steps" --lr "$1" --tp 2 --dp 2 --json --save "$2" "${extra[@]}"
}
# shellcheck disable=SC2046
mpirun -np 4 --oversubscribe --bind-to none "$tpr" $(train_args 1e-3 "$tmp/one") >"$tmp/one.jsonl" ||
  { cat "$tmp/one.jsonl"; fail "tpr train on one host"; }
r0=$(rx 0) r1=$(rx 1)
# shellcheck disable=SC2046
cluster 2 -- "$tpr" $(train_args 1e-3 "$tmp/two") >"$tmp/two.jsonl" ||
  { cat "$tmp/two.jsonl"; fail "tpr train across hosts"; }
d0=$(($(rx 0) - r0)) d1=$(($(rx 1) - r1))
dense=$(python3 "$here/compare.py" bytes "$tmp/one/model.safetensors" --exclude 'experts\.|e_score_correction_bias')
need=$((steps * dense / 2))
echo "train (${extra[*]:-no extra args}): eth0 rx host0 $d0 B, host1 $d1 B (>= $need: $steps steps x dense $dense B / 2)"
[ "$d0" -ge "$need" ] && [ "$d1" -ge "$need" ] || fail "too few bytes crossed the hosts for a dp step"
python3 "$here/compare.py" losses "$tmp/two.jsonl" "$tmp/one.jsonl" --tol 1e-6 || fail "losses differ"
python3 "$here/compare.py" params "$tmp/two/model.safetensors" "$tmp/one/model.safetensors" --tol 1e-6 ||
  fail "saved parameters differ"

# 4. negative control: another learning rate must fail both comparisons
# shellcheck disable=SC2046
mpirun -np 4 --oversubscribe --bind-to none "$tpr" $(train_args 2e-3 "$tmp/neg") >"$tmp/neg.jsonl" ||
  { cat "$tmp/neg.jsonl"; fail "tpr train (negative control)"; }
echo "negative control (--lr 2e-3 on one host against the 2-host run):"
! python3 "$here/compare.py" losses "$tmp/two.jsonl" "$tmp/neg.jsonl" --tol 1e-6 || fail "losses comparison cannot fail"
! python3 "$here/compare.py" params "$tmp/two/model.safetensors" "$tmp/neg/model.safetensors" --tol 1e-6 ||
  fail "parameter comparison cannot fail"
echo "PASS: 2 hosts x 2 ranks match 1 host x 4 ranks (tp 2, dp 2); the negative control differs"
