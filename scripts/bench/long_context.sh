#!/usr/bin/env bash
# Long-context decode of a hybrid model against its all-softmax twin (issue 34
# for minimax, issue 35 item 4 for MiniCPM-SALA): tpr bench model --context
# on each config of a pair, random weights, one after the other, then a table
# of decode tok/s, the speed-up, memory per sequence and its ratio.
#   scripts/bench/long_context.sh [--pair sala|minimax] [--contexts 1024,8192,32768] [--gen-len 32] [--threads N]
# --threads sets TPR_NUM_THREADS for both runs (default: the machine's; on a
# shared machine 1 keeps other processes from stalling an OpenMP team).
# Compare only runs made back to back on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
pair=sala contexts=1024,8192,32768 gen=32 threads=
while [ $# -gt 0 ]; do
  case "$1" in
    --pair) pair=$2; shift 2 ;;
    --contexts) contexts=$2; shift 2 ;;
    --gen-len) gen=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "long_context.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
case "$pair" in
  sala) hybrid=configs/minicpm_sala_small.json twin=configs/minicpm_sala_small_softmax.json ;;
  minimax) hybrid=configs/minimax_small.json twin=configs/minimax_small_softmax.json ;;
  *) echo "long_context.sh: --pair sala or minimax, not $pair" >&2; exit 2 ;;
esac
TPR=build/bin/tpr
[ -x "$TPR" ] || scripts/setup.sh >/dev/null
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for c in hybrid twin; do
  cfg=${!c}
  echo "running $cfg ..." >&2
  TPR_NUM_THREADS=${threads:-${TPR_NUM_THREADS:-}} "$TPR" bench model --config "$cfg" --random-weights \
    --context "$contexts" --gen-len "$gen" --json > "$W/$c.json"
done
python3 - "$W/hybrid.json" "$W/twin.json" <<'PY'
import json, sys
h, t = (json.load(open(p)) for p in sys.argv[1:3])
mib = lambda b: b / 2**20
print("| context | decode tok/s hybrid | decode tok/s all-softmax | speed-up | memory per sequence hybrid (KV + state) | all-softmax (KV) | ratio |")
print("|---:|---:|---:|---:|---|---|---:|")
for a, b in zip(h["contexts"], t["contexts"]):
    ma = a["kv_bytes_per_seq_per_rank"] + a["state_bytes_per_seq_per_rank"]
    mb = b["kv_bytes_per_seq_per_rank"] + b["state_bytes_per_seq_per_rank"]
    print(f'| {a["context"]} | {a["decode_tok_s"]:.1f} | {b["decode_tok_s"]:.1f} | {a["decode_tok_s"] / b["decode_tok_s"]:.1f}x '
          f'| {mib(a["kv_bytes_per_seq_per_rank"]):.1f} MiB + {mib(a["state_bytes_per_seq_per_rank"]):.2f} MiB '
          f'| {mib(b["kv_bytes_per_seq_per_rank"]):.1f} MiB | {ma / mb:.2f} |')
PY
