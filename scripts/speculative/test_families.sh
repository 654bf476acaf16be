#!/usr/bin/env bash
# Speculative decoding on every family's fixture through `tpr run`: greedy
# tokens with --speculative lookup:2:4 and self:1:3 equal those without, at
# tp 1 and under mpirun -np 2 (tp 2, and ep 2 for the MoE families), and
# each run verified drafts (so the comparison is not empty). The hybrid
# families (minimax, minicpm_sala: recurrent state, rolled back by snapshot
# and recompute) the same with lookup and self drafts at tp 1 and tp 2.
# usage: test_families.sh TPR FIXTURES MPIEXEC
set -euo pipefail
TPR=$1 FIX=$2 MPI=$3
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
fails=0
pass() { echo "ok: $*"; }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# generated ids of every prompt, and the drafts verified ("-" without).
summary() {
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print(";".join(",".join(map(str, p["generated"])) for p in d["prompts"]), d.get("speculative", {}).get("drafted", "-"))' "$1"
}

run() {  # out mesh-args... -- run-args...
  local out=$1; shift
  local np=$1; shift
  if [ "$np" = 1 ]; then
    "$TPR" run "$@" --json > "$out" 2> "$out.err"
  else
    "$MPI" -np "$np" --oversubscribe "$TPR" run "$@" --json > "$out" 2> "$out.err"
  fi
}

PROMPTS=(--prompt-ids 5,17,9,5,17,9,5,17 --prompt-ids 3,1,4,1,5,9,2,6,5,3,5)
for fam in minimax_m2_tiny qwen3_moe_tiny hunyuan_moe_tiny qwen2_vl_tiny qwen3_vl_moe_tiny demo_model; do
  moe=1
  [ "$fam" = qwen2_vl_tiny ] && moe=0
  meshes=("1" "2 --tp 2")
  [ $moe = 1 ] && meshes+=("2 --tp 1 --dp 2 --ep 2")
  for mesh in "${meshes[@]}"; do
    set -- $mesh
    np=$1; shift
    args=(--model "$FIX/$fam" "${PROMPTS[@]}" --max-new-tokens 16 "$@")
    if ! run "$W/plain" "$np" "${args[@]}"; then fail "$fam [$mesh]: plain run failed: $(tail -3 "$W/plain.err")"; continue; fi
    read -r want _ < <(summary "$W/plain")
    for spec in lookup:2:4 self:1:3; do
      if ! run "$W/spec" "$np" "${args[@]}" --speculative "$spec"; then
        fail "$fam [$mesh] $spec: run failed: $(tail -3 "$W/spec.err")"
        continue
      fi
      read -r got drafted < <(summary "$W/spec")
      if [ "$got" = "$want" ] && [ "$drafted" != "-" ] && [ "$drafted" -gt 0 ]; then
        pass "$fam [np $mesh] $spec: tokens equal, $drafted drafts verified"
      else
        fail "$fam [np $mesh] $spec: got $got (drafts $drafted), want $want"
      fi
    done
  done
done

# The hybrid families: lookup and self drafts equal plain decoding (rejected
# drafts roll the state back; self drafts' rounds move the first layers'
# states, which the verification starts from again), at tp 1 and tp 2;
# rollbacks reported. minimax: lightning beside softmax layers.
# minicpm_sala: lightning beside InfLLM-v2 sparse layers (dense_len 48), with
# a 40-token prompt whose generation crosses dense_len: verification rows
# straddle it, and each row must decide dense or sparse as its own decode
# call would (the engine's per-row rule), or the tokens differ.
sala_long=$(python3 -c 'print(",".join(str((i * 37 + 11) % 61 + 2) for i in range(40)))')
for model in minimax_tiny minicpm_sala_tiny; do
  extra=(--prompt-ids 7,7,7,7)
  [ "$model" = minicpm_sala_tiny ] && extra+=(--prompt-ids "$sala_long")
  for mesh in "1" "2 --tp 2"; do
    set -- $mesh
    np=$1; shift
    args=(--model "$FIX/$model" "${PROMPTS[@]}" "${extra[@]}" --max-new-tokens 24 "$@")
    if ! run "$W/plain" "$np" "${args[@]}"; then fail "$model [$mesh]: plain run failed: $(tail -3 "$W/plain.err")"; continue; fi
    read -r want _ < <(summary "$W/plain")
    for spec in lookup:2:4 self:1:3 self:2:2; do
      if ! run "$W/spec" "$np" "${args[@]}" --speculative "$spec"; then
        fail "$model [$mesh] $spec: run failed: $(tail -3 "$W/spec.err")"
        continue
      fi
      read -r got drafted < <(summary "$W/spec")
      rb=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))["speculative"]; print(s["state_rollbacks"], s["recomputed_tokens"])' "$W/spec")
      if [ "$got" = "$want" ] && [ "$drafted" != "-" ] && [ "$drafted" -gt 0 ]; then
        pass "$model (hybrid) [np $mesh] $spec: tokens equal, $drafted drafts verified, rollbacks and recomputed tokens: $rb"
      else
        fail "$model (hybrid) [np $mesh] $spec: got $got (drafts $drafted), want $want"
      fi
    done
  done
done
# Bad values: a clear message, exit 2.
for bad in lookup:0:4 lookup:2 self:9:2 self:1:99 nonsense; do
  rc=0
  "$TPR" run --model "$FIX/minimax_m2_tiny" --prompt-ids 5,17,9 --max-new-tokens 4 --speculative "$bad" \
    > "$W/bad" 2> "$W/bad.err" || rc=$?
  if [ $rc -ne 0 ] && grep -qi "speculative\|self-speculative" "$W/bad.err"; then
    pass "--speculative $bad refused (exit $rc): $(grep -i speculative "$W/bad.err" | head -1 | cut -c1-150)"
  else
    fail "--speculative $bad: exit $rc, $(cat "$W/bad.err")"
  fi
done
[ $fails = 0 ] && echo "all passed" || { echo "$fails failed"; exit 1; }
